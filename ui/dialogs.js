// The two modal dialogs of index.html: confirming an action, and asking for an access token.
// Native <dialog> with showModal() keeps keyboard focus inside, and Escape cancels.

import { replace } from './dom.js';

const byId = (id) => document.getElementById(id);

// Shows the confirmation dialog; resolves true when the user confirms. `details` is an optional
// node (e.g. the purge's state checkboxes) that the caller reads after the dialog closed.
// `danger` puts the focus on Cancel, so that Enter alone does not destroy anything.
export function confirmAction({ title, message, details = null, confirmLabel = 'Confirm', danger = false }) {
  const dialog = byId('confirm-dialog');
  replace(byId('confirm-title'), title);
  replace(byId('confirm-message'), message);
  replace(byId('confirm-details'), details);
  const confirm = byId('confirm-ok');
  confirm.textContent = confirmLabel;
  confirm.classList.toggle('danger', danger);
  return new Promise((resolve) => {
    dialog.returnValue = '';
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'confirm'), { once: true });
    dialog.showModal();
    (danger ? byId('confirm-cancel') : confirm).focus();
  });
}

// Asks for a bearer token; resolves with it, or null when the user cancels. `refused` says the
// previous token was not accepted.
export function askToken(refused) {
  const dialog = byId('token-dialog');
  const input = byId('token-input');
  byId('token-error').hidden = !refused;
  input.value = '';
  return new Promise((resolve) => {
    dialog.returnValue = '';
    dialog.addEventListener(
      'close',
      () => resolve(dialog.returnValue === 'ok' && input.value.trim() ? input.value.trim() : null),
      { once: true },
    );
    dialog.showModal();
    input.focus();
  });
}
