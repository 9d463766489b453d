package jobbroker_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"jobbroker.dev/client/go/jobbroker"
)

func TestPermanentAndRetryAfterWrap(t *testing.T) {
	base := errors.New("no such mailbox")
	err := fmt.Errorf("sending: %w", jobbroker.Permanent(base))
	var perm *jobbroker.PermanentError
	if !errors.As(err, &perm) || !errors.Is(err, base) || err.Error() != "sending: no such mailbox" {
		t.Fatalf("Permanent: %v", err)
	}
	err = jobbroker.RetryAfter(time.Minute, base)
	var after *jobbroker.RetryAfterError
	if !errors.As(err, &after) || after.Delay != time.Minute || !errors.Is(err, base) {
		t.Fatalf("RetryAfter: %v", err)
	}
	if jobbroker.Permanent(nil) != nil || jobbroker.RetryAfter(time.Second, nil) != nil {
		t.Fatal("wrapping nil must give nil")
	}
}
