// A page that shows one read of the broker and reads it again on the app's 2-second poll (while
// the tab is visible): the cluster and workers pages. One read at a time; nothing is shown after
// the page was left.

import { setText } from './dom.js';

// Reads with `load()` now and on every poll, hands each answer to `show`, and puts a failure in
// the `error` element as "Cannot <what>: <message>". Returns the view's hooks for the app.
export function polled({ load, show, error, what }) {
  let disposed = false;
  let loading = false;

  async function refresh() {
    if (loading || disposed) return;
    loading = true;
    try {
      const answer = await load();
      if (!disposed) show(answer);
    } catch (err) {
      if (!disposed) {
        error.hidden = false;
        setText(error, `Cannot ${what}: ${err.message}`);
      }
    } finally {
      loading = false;
    }
  }
  refresh();

  return {
    onQueues: refresh,
    onPollError: refresh,
    dispose() {
      disposed = true;
    },
  };
}
