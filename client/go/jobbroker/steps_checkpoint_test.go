package jobbroker

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "jobbroker.dev/client/go/jobbrokerv1"
)

func encodeSteps(t *testing.T, steps ...*pb.CompletedStep) []byte {
	t.Helper()
	data, err := proto.Marshal(&pb.StepCheckpoint{Steps: steps})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// The checkpoint rules are the same in every language's helper (steps.proto): what another
// helper wrote is read, a newer helper's extra fields are ignored, and bytes that something other
// than durable steps wrote are refused with the reason.
func TestLoadStepCheckpoint(t *testing.T) {
	valid := encodeSteps(t, &pb.CompletedStep{Name: "a", Result: []byte(`{"n":1}`)},
		&pb.CompletedStep{Name: "b", Result: []byte(`null`)})
	// A field number StepCheckpoint does not have yet, as a newer helper might add.
	newer := protowire.AppendTag(append([]byte{}, valid...), 9, protowire.VarintType)
	newer = protowire.AppendVarint(newer, 1)

	for _, tc := range []struct {
		name, why string
		data      []byte
		steps     []string
	}{
		{name: "empty", data: nil},
		{name: "valid", data: valid, steps: []string{"a", "b"}},
		{name: "unknown field from a newer helper", data: newer, steps: []string{"a", "b"}},
		{name: "not protobuf", data: []byte("not a step checkpoint"), why: "cannot parse"},
		{name: "only a foreign field", data: []byte{0x08, 0x01}, why: "holds no step"},
		{name: "empty step name", data: []byte{0x0a, 0x00}, why: `bad or repeated step name ""`},
		{name: "repeated step name", why: `bad or repeated step name "a"`, data: encodeSteps(t,
			&pb.CompletedStep{Name: "a", Result: []byte(`1`)}, &pb.CompletedStep{Name: "a", Result: []byte(`2`)})},
		{name: "result not JSON", why: `step "a" has a result that is not JSON`,
			data: encodeSteps(t, &pb.CompletedStep{Name: "a", Result: []byte(`{`)})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			results := map[string][]byte{}
			why := loadStepCheckpoint(tc.data, &pb.StepCheckpoint{}, results)
			if tc.why == "" && why != "" {
				t.Fatalf("refused: %s", why)
			}
			if tc.why != "" && !strings.Contains(why, tc.why) {
				t.Fatalf("reason = %q, want it to contain %q", why, tc.why)
			}
			if tc.why == "" && len(results) != len(tc.steps) {
				t.Fatalf("results = %v, want steps %v", results, tc.steps)
			}
			for _, name := range tc.steps {
				if _, ok := results[name]; !ok {
					t.Fatalf("step %q missing from %v", name, results)
				}
			}
		})
	}
}
