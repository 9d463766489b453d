package jobbroker

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// The broker's own test checks every line of this file against its code (core/ids.cc), so
// agreeing with each line is agreeing with the broker.
func partitionVectorsPath() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "tests", "client", "partition_vectors.tsv")
}

func TestPartitionsAgreeWithEveryLineOfTheBrokersVectors(t *testing.T) {
	data, err := os.ReadFile(partitionVectorsPath())
	if err != nil {
		t.Fatal(err)
	}
	checked := map[string]int{}
	for number, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, "\t")
		if len(fields) != 4 {
			t.Fatalf("line %d: %d fields, want 4: %q", number+1, len(fields), line)
		}
		kind, key, want := fields[0], fields[1], fields[3]
		count, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil {
			t.Fatalf("line %d: count %q: %v", number+1, fields[2], err)
		}
		var got string
		switch kind {
		case "queue":
			got = strconv.FormatUint(uint64(partitionOfQueue(key, uint32(count))), 10)
		case "job":
			got = "none"
			if partition, ok := partitionOfJobID(key, uint32(count)); ok {
				got = strconv.FormatUint(uint64(partition), 10)
			}
		default:
			t.Fatalf("line %d: unknown kind %q", number+1, kind)
		}
		if got != want {
			t.Errorf("line %d: %s %q in %d partitions: got %s, want %s", number+1, kind, key, count, got, want)
		}
		checked[kind]++
	}
	if checked["queue"] == 0 || checked["job"] == 0 {
		t.Fatalf("checked %v: the file lost its queue or job lines", checked)
	}
}
