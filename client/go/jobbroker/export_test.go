package jobbroker

// For the tests of package jobbroker_test: where the broker places a queue and a job.
var (
	PartitionOfQueue = partitionOfQueue
	PartitionOfJobID = partitionOfJobID
)

// WaitingEnqueues is how many jobs of c's Enqueue calls wait in batches not yet sent.
func WaitingEnqueues(c *Client) int {
	if c.batcher == nil {
		return 0
	}
	co := c.batcher
	co.mu.Lock()
	defer co.mu.Unlock()
	n := 0
	for _, ks := range co.keys {
		if ks.open != nil {
			n += len(ks.open.jobs)
		}
		for _, b := range ks.ready {
			n += len(b.jobs)
		}
	}
	return n
}
