package jobbroker

import (
	"slices"
	"testing"
)

// The groups of a worker over queues of every partition of threeNodes(): one per live leader,
// sorted by address, then one for any node with the queues whose partition has no live leader
// (last, although its address "" would sort first).
func TestAWorkersQueuesAreGroupedByLeaderWithSharesOfMaxInFlight(t *testing.T) {
	table := newRoutingTable(threeNodes(), "seed:1")
	p0, p1, p2, p3 := queuesOf(0, 4, 2), queuesOf(1, 4, 1), queuesOf(2, 4, 2), queuesOf(3, 4, 1)
	// Given in no order, and one twice.
	queues := []string{p2[1], p3[0], p0[1], p1[0], p2[0], p0[0], p0[0]}
	wantQueues := []struct {
		address string
		queues  []string
	}{
		{"a:1", slices.Sorted(slices.Values(p0))},
		{"c:1", slices.Sorted(slices.Values(p2))},
		{"", slices.Sorted(slices.Values(append(slices.Clone(p1), p3...)))},
	}
	for _, tc := range []struct {
		maxInFlight int
		shares      []int
	}{
		{1, []int{1, 1, 1}}, // fewer than the groups: each still gets one
		{2, []int{1, 1, 1}},
		{3, []int{1, 1, 1}}, // as many as the groups
		{8, []int{3, 3, 2}}, // more: the remainder to the first
		{0, []int{0, 0, 0}},
	} {
		groups := groupQueues(table, queues, tc.maxInFlight)
		if len(groups) != len(wantQueues) {
			t.Fatalf("max %d: groups %+v, want %d", tc.maxInFlight, groups, len(wantQueues))
		}
		for i, g := range groups {
			if g.address != wantQueues[i].address || !slices.Equal(g.queues, wantQueues[i].queues) ||
				g.maxInFlight != tc.shares[i] {
				t.Errorf("max %d: group %d = %+v, want %v with share %d",
					tc.maxInFlight, i, g, wantQueues[i], tc.shares[i])
			}
		}
	}
}

func TestQueuesOfOneLeaderOrWithoutATableAreOneGroup(t *testing.T) {
	table := newRoutingTable(threeNodes(), "seed:1")
	queues := queuesOf(0, 4, 3)
	want := []streamGroup{{address: "a:1", queues: slices.Sorted(slices.Values(queues)), maxInFlight: 5}}
	if got := groupQueues(table, reversed(queues), 5); !slices.EqualFunc(got, want, streamGroup.equal) {
		t.Errorf("one leader: %+v, want %+v", got, want)
	}
	all := append(queuesOf(1, 4, 1), queuesOf(2, 4, 1)...)
	for _, table := range []*routingTable{nil, singleBrokerTable("b:1")} {
		want := []streamGroup{{queues: slices.Sorted(slices.Values(all)), maxInFlight: 5}}
		if got := groupQueues(table, all, 5); !slices.EqualFunc(got, want, streamGroup.equal) {
			t.Errorf("table %+v: %+v, want %+v", table, got, want)
		}
	}
}

func reversed(s []string) []string {
	out := slices.Clone(s)
	slices.Reverse(out)
	return out
}

// A worker fetches the table again after each backoff delay while a cluster's table leaves it a
// group for any node (docs/worker-contract.md §5), and not otherwise: not once every queue has
// a leader, and not without a cluster's table, whose one group for any node is all there is.
func TestAWorkerRechecksTheTableWhileAClustersTableLeavesItAGroupForAnyNode(t *testing.T) {
	cluster := newRoutingTable(threeNodes(), "seed:1")
	led := append(queuesOf(0, 4, 1), queuesOf(2, 4, 1)...)
	for _, tc := range []struct {
		what   string
		table  *routingTable
		queues []string
		want   bool
	}{
		{"a partition without a leader", cluster, append(slices.Clone(led), queuesOf(3, 4, 1)...), true},
		{"a partition whose leader is not alive", cluster, queuesOf(1, 4, 1), true},
		{"every partition led", cluster, led, false},
		{"no table", nil, led, false},
		{"a single broker", singleBrokerTable("b:1"), led, false},
	} {
		groups := groupQueues(tc.table, tc.queues, 4)
		if got := recheckTableFor(tc.table, groups); got != tc.want {
			t.Errorf("%s: groups %+v: recheck = %v, want %v", tc.what, groups, got, tc.want)
		}
	}
}
