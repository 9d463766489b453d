// The cluster page (#/cluster): the nodes with what each leads, every partition with its leader,
// epoch, replicas and in-sync set, and a log of the leader changes seen while the page is open,
// so an operator can watch a failover happen. Refreshed on the app's 2-second poll.
// On a single node it says so and shows its partitions, all led by itself.

import { h, replace, setText } from './dom.js';
import { polled } from './polled.js';
import { formatCount, formatTime } from './format.js';

// Leader changes kept in the log, newest first.
const MAX_EVENTS = 50;

export function render(root, ctx) {
  ctx.setTitle('Cluster');
  const error = h('p', { class: 'banner error', role: 'alert', hidden: true });
  const summary = h('p', { class: 'totals muted' });
  const health = h('div');
  const nodesBody = h('tbody');
  const partitionsBody = h('tbody');
  const eventsList = h('ol', { class: 'events' });
  const noEvents = h('p', { class: 'muted' }, 'No leader has changed since this page was opened.');

  const table = (caption, columns, body) =>
    h(
      'div',
      { class: 'table-scroll', role: 'region', 'aria-label': `${caption} table`, tabindex: '0' },
      h(
        'table',
        { class: 'cluster' },
        h('caption', { class: 'visually-hidden' }, caption),
        h('thead', {}, h('tr', {}, columns.map(([label, cls]) => h('th', { scope: 'col', class: cls }, label)))),
        body,
      ),
    );

  root.append(
    h('h1', { tabindex: '-1' }, 'Cluster'),
    error,
    summary,
    health,
    h(
      'section',
      { 'aria-labelledby': 'nodes-heading' },
      h('h2', { id: 'nodes-heading' }, 'Nodes'),
      table(
        'Nodes',
        [['Node'], ['Address'], ['Status'], ['Leads', 'num'], ['Replicas', 'num'], ['In sync', 'num']],
        nodesBody,
      ),
    ),
    h(
      'section',
      { 'aria-labelledby': 'partitions-heading' },
      h('h2', { id: 'partitions-heading' }, 'Partitions'),
      table(
        'Partitions',
        [['Partition', 'num'], ['Leader'], ['Epoch', 'num'], ['Replicas (in sync marked)'], ['Status']],
        partitionsBody,
      ),
    ),
    h(
      'section',
      { 'aria-labelledby': 'events-heading' },
      h('h2', { id: 'events-heading' }, 'Leader changes'),
      noEvents,
      eventsList,
    ),
  );

  // partition -> {leader, epoch} of the previous refresh, to log changes.
  let previous = null;

  function logChange(partition, before, after) {
    const what = after.leader
      ? before.leader
        ? `led by ${after.leader} (was ${before.leader}), epoch ${after.epoch}`
        : `led by ${after.leader}, epoch ${after.epoch}`
      : `has no leader (was ${before.leader}): its writes are refused until one is elected`;
    eventsList.prepend(
      h(
        'li',
        { class: after.leader ? '' : 'error-text' },
        h('time', { datetime: new Date().toISOString() }, formatTime(new Date())),
        ` Partition ${partition} ${what}`,
      ),
    );
    while (eventsList.children.length > MAX_EVENTS) eventsList.lastElementChild.remove();
    noEvents.hidden = true;
  }

  function show(cluster) {
    error.hidden = true;
    const partitions = cluster.partitions ?? [];
    // etcd lists only the nodes holding a lease: one that died or lost etcd drops out of
    // `nodes`, but the partitions still name it as a replica, and it is shown as down.
    const nodes = [...(cluster.nodes ?? [])];
    const listed = new Set(nodes.map((n) => n.nodeId));
    for (const p of partitions) {
      for (const r of p.replicas ?? []) {
        if (!listed.has(r)) {
          listed.add(r);
          nodes.push({ nodeId: r, address: '', alive: false });
        }
      }
    }
    nodes.sort((a, b) => a.nodeId.localeCompare(b.nodeId, undefined, { numeric: true }));
    const rf = cluster.replicationFactor ?? 1;
    const single = !cluster.clusterName;

    const up = nodes.filter((n) => n.alive).length;
    setText(
      summary,
      single
        ? `A single node: ${formatCount(partitions.length)} ${partitions.length === 1 ? 'partition' : 'partitions'}, ` +
            'each kept on this node only. Start the broker with --cluster-etcd to replicate them.'
        : `Cluster “${cluster.clusterName}” · ${formatCount(nodes.length)} nodes, ${formatCount(up)} up · ` +
            `${formatCount(partitions.length)} partitions · replication factor ${rf}, ` +
            `writes need ${cluster.minInSync ?? 1} in sync · this page is served by ${cluster.nodeId}`,
    );

    const leaderless = partitions.filter((p) => !p.leaderNodeId);
    const under = partitions.filter((p) => p.leaderNodeId && (p.inSync ?? []).length < rf && !single);
    replace(
      health,
      leaderless.length > 0 &&
        h(
          'p',
          { class: 'banner error', role: 'alert' },
          `${leaderless.length === 1 ? 'Partition' : 'Partitions'} ${leaderless.map((p) => p.partition ?? 0).join(', ')} ` +
            `${leaderless.length === 1 ? 'has' : 'have'} no leader: ${leaderless.length === 1 ? 'its' : 'their'} queues ` +
            'refuse calls with UNAVAILABLE until a replica is elected.',
        ),
      under.length > 0 &&
        h(
          'p',
          { class: 'banner warn' },
          `${formatCount(under.length)} ${under.length === 1 ? 'partition is' : 'partitions are'} under-replicated ` +
            `(fewer than ${rf} replicas in sync): ${under.map((p) => p.partition ?? 0).join(', ')}.`,
        ),
      leaderless.length === 0 &&
        under.length === 0 &&
        h('p', { class: 'banner ok' }, 'Every partition has a leader and all its replicas in sync.'),
    );

    const aliveById = new Map(nodes.map((n) => [n.nodeId, n.alive]));
    replace(
      nodesBody,
      nodes.map((n) => {
        const leads = partitions.filter((p) => p.leaderNodeId === n.nodeId).length;
        const replicas = partitions.filter((p) => (p.replicas ?? []).includes(n.nodeId)).length;
        const inSync = partitions.filter((p) => (p.inSync ?? []).includes(n.nodeId)).length;
        return h(
          'tr',
          { 'data-node': n.nodeId },
          h('th', { scope: 'row', class: 'mono' }, n.nodeId || '(this node)'),
          h('td', { class: 'mono' }, n.address || h('span', { class: 'muted' }, 'not registered')),
          h('td', {}, h('span', { class: n.alive ? 'badge up' : 'badge down' }, n.alive ? 'Up' : 'Down')),
          h('td', { class: 'num' }, formatCount(leads)),
          h('td', { class: 'num' }, formatCount(replicas)),
          h('td', { class: 'num' }, formatCount(inSync)),
        );
      }),
    );

    replace(
      partitionsBody,
      partitions.map((p) => {
        const number = p.partition ?? 0;
        const inSync = new Set(p.inSync ?? []);
        const replicas = p.replicas ?? [];
        let status;
        if (!p.leaderNodeId) status = h('span', { class: 'badge down' }, 'No leader');
        else if (!single && inSync.size < rf)
          status = h('span', { class: 'badge paused' }, `Under-replicated: ${inSync.size} of ${rf} in sync`);
        else status = h('span', { class: 'badge up' }, 'OK');
        return h(
          'tr',
          { 'data-partition': number },
          h('th', { scope: 'row', class: 'num' }, number),
          h('td', { class: 'mono' }, p.leaderNodeId || h('span', { class: 'error-text' }, 'none')),
          h('td', { class: 'num mono' }, p.epoch ?? '0'),
          h(
            'td',
            {},
            replicas.map((r) =>
              h(
                'span',
                {
                  class: `replica${inSync.has(r) ? ' in-sync' : ''}${aliveById.get(r) === false ? ' down' : ''}`,
                  title: `${r}: ${inSync.has(r) ? 'in sync' : 'not in sync'}${r === p.leaderNodeId ? ', leader' : ''}`,
                },
                r === p.leaderNodeId ? `★ ${r}` : r,
                inSync.has(r) ? ' ✓' : '',
              ),
            ),
          ),
          h('td', {}, status),
        );
      }),
    );

    const now = new Map(partitions.map((p) => [p.partition ?? 0, { leader: p.leaderNodeId ?? '', epoch: p.epoch ?? '0' }]));
    if (previous) {
      for (const [partition, after] of now) {
        const before = previous.get(partition);
        if (before && before.leader !== after.leader) logChange(partition, before, after);
      }
    }
    previous = now;
  }

  return polled({ load: () => ctx.api.getCluster(), show, error, what: 'read the cluster' });
}
