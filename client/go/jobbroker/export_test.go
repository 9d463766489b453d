package jobbroker

// For the tests of package jobbroker_test: where the broker places a queue and a job.
var (
	PartitionOfQueue = partitionOfQueue
	PartitionOfJobID = partitionOfJobID
)
