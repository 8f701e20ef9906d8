package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/throttle"
)

// line is one JSON line of --file. Absent fields take the job flags'
// values.
type line struct {
	Tenant    string          `json:"tenant"`
	Type      string          `json:"type"`
	Payload   json.RawMessage `json:"payload"`
	Queue     *string         `json:"queue"`
	Cost      *int64          `json:"cost"`
	ID        *string         `json:"id"`
	ProcessIn *string         `json:"process_in"`
	MaxRetry  *int            `json:"max_retry"`
}

const knownFields = "tenant, type, payload, queue, cost, id, process_in, max_retry"

// parseLine turns one line into a job, with the flags as defaults.
func (o *options) parseLine(b []byte) (queue.Job, error) {
	b = bytes.TrimRight(b, "\r\n")
	var l line
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return queue.Job{}, lineJSONError(b, err)
	}
	if dec.More() {
		return queue.Job{}, errors.New("more than one JSON value on the line; put one job on each line")
	}
	if bytes.TrimSpace(b)[0] != '{' {
		return queue.Job{}, errors.New("not a JSON object; want {\"tenant\": …, \"type\": …, \"payload\": …}")
	}
	tenant, typ := l.Tenant, l.Type
	if tenant == "" {
		if o.tenant == "" {
			return queue.Job{}, errors.New("no tenant: add \"tenant\" to the line or give --tenant")
		}
		tenant = o.tenant
	}
	if err := throttle.ValidateTenant(tenant); err != nil {
		return queue.Job{}, err
	}
	if typ == "" {
		if o.typ == "" {
			return queue.Job{}, errors.New("no type: add \"type\" to the line or give --type")
		}
		typ = o.typ
	}
	q := o.queue
	if l.Queue != nil {
		if strings.TrimSpace(*l.Queue) == "" {
			return queue.Job{}, fmt.Errorf("queue %q: the queue name must not be blank; leave \"queue\" out for %q", *l.Queue, o.queue)
		}
		q = *l.Queue
	}
	cost := o.cost
	if l.Cost != nil {
		if *l.Cost < 1 {
			return queue.Job{}, fmt.Errorf("cost %d: must be at least 1 (the default)", *l.Cost)
		}
		cost = *l.Cost
	}
	in := o.in
	if l.ProcessIn != nil {
		d, err := time.ParseDuration(*l.ProcessIn)
		if err != nil || d < 0 {
			return queue.Job{}, fmt.Errorf("process_in %q: want a duration such as \"90s\" or \"5m\"", *l.ProcessIn)
		}
		in = d
	}
	id := ""
	if l.ID != nil {
		if strings.TrimSpace(*l.ID) == "" {
			return queue.Job{}, fmt.Errorf("id %q: the task id must not be blank; leave \"id\" out for a random one", *l.ID)
		}
		id = *l.ID
	}
	maxRetry, maxRetrySet := o.maxRetry, o.maxRetrySet
	if l.MaxRetry != nil {
		if *l.MaxRetry < 0 {
			return queue.Job{}, fmt.Errorf("max_retry %d: must be 0 or more", *l.MaxRetry)
		}
		maxRetry, maxRetrySet = *l.MaxRetry, true
	}
	var payload []byte
	if len(l.Payload) > 0 && string(l.Payload) != "null" {
		payload = l.Payload
	}
	return queue.Job{Tenant: tenant, Task: asynq.NewTask(typ, payload), Options: jobOptions(q, cost, in, id, maxRetry, maxRetrySet)}, nil
}

// lineJSONError explains why a line is not a job.
func lineJSONError(b []byte, err error) error {
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &te):
		want := map[reflect.Kind]string{reflect.String: "a string", reflect.Int64: "a whole number", reflect.Int: "a whole number", reflect.Struct: "an object"}[te.Type.Kind()]
		if te.Type.Kind() == reflect.Pointer {
			want = map[reflect.Kind]string{reflect.String: "a string", reflect.Int64: "a whole number", reflect.Int: "a whole number"}[te.Type.Elem().Kind()]
		}
		if te.Field == "" {
			return errors.New("not a JSON object; want {\"tenant\": …, \"type\": …, \"payload\": …}")
		}
		return fmt.Errorf("%q is a JSON %s; want %s", te.Field, te.Value, want)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fmt.Errorf("unknown field %s; known: %s", strings.TrimPrefix(err.Error(), "json: unknown field "), knownFields)
	}
	return fmt.Errorf("not valid JSON: %s", jsonProblem(b))
}

// jsonProblem says where and why b is not valid JSON.
func jsonProblem(b []byte) string {
	var v any
	err := json.Unmarshal(b, &v)
	if err == nil {
		return "valid"
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%s at byte %d", strings.TrimPrefix(se.Error(), "json: "), se.Offset)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// checkID refuses a task id that an earlier line gave for the same queue:
// asynq would refuse the job anyway, and this names the line.
func checkID(seen map[[2]string]int, j queue.Job, n int) error {
	var q, id string
	for _, opt := range j.Options {
		switch opt.Type() {
		case asynq.QueueOpt:
			q, _ = opt.Value().(string)
		case asynq.TaskIDOpt:
			id, _ = opt.Value().(string)
		}
	}
	if id == "" {
		return nil
	}
	k := [2]string{q, id}
	if first, ok := seen[k]; ok {
		return fmt.Errorf("id %q: line %d already gave this task id in queue %q; task ids must be unique", id, first, q)
	}
	seen[k] = n
	return nil
}

// rawLine is one line read from --file, or the error that ended reading.
type rawLine struct {
	n   int
	b   []byte
	err error
}

// flushAfter bounds how long a partial batch waits for more lines (input
// from a pipe may come slowly).
const flushAfter = 20 * time.Millisecond

// file enqueues the jobs of the JSON lines read from in.
func (e *enqueuer) file(ctx context.Context, in io.Reader, name string) int {
	total := int64(-1)
	if !e.o.quiet {
		total = countLines(in)
	}
	p := e.progress(total)
	start := time.Now()

	lines := make(chan rawLine, batchSize)
	quit := make(chan struct{})
	defer close(quit)
	go readLines(in, lines, quit)

	var (
		done, failed, last int
		readErr            error
		interrupted        bool
		batch              []queue.Job
		nums               []int
		ids                = map[[2]string]int{} // queue and task id → the line that gave them
	)
	flush := func() {
		if len(batch) == 0 {
			return
		}
		for i, r := range e.client.EnqueueBatch(context.WithoutCancel(ctx), batch) {
			if r.Err != nil {
				failed++
				p.note(fmt.Sprintf("enqueue: line %d: %s", nums[i], explain(r.Err)))
				continue
			}
			done++
		}
		last = nums[len(nums)-1]
		batch, nums = batch[:0], nums[:0]
		p.add(done, failed)
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	eof := false
	for !eof && !interrupted {
		if ctx.Err() != nil {
			interrupted = true
			break
		}
		select {
		case <-ctx.Done():
			interrupted = true
		case <-timer.C:
			flush()
		case l, ok := <-lines:
			switch {
			case !ok:
				eof = true
			case l.err != nil:
				readErr, eof = l.err, true
			case len(bytes.TrimSpace(l.b)) == 0:
				if len(batch) == 0 {
					last = l.n
				}
			default:
				j, err := e.o.parseLine(l.b)
				if err == nil {
					err = checkID(ids, j, l.n)
				}
				if err != nil {
					failed++
					p.note(fmt.Sprintf("enqueue: line %d: %s", l.n, err))
					if len(batch) == 0 {
						last = l.n
						p.add(done, failed)
					}
					break
				}
				if len(batch) == 0 {
					timer.Reset(flushAfter)
				}
				batch, nums = append(batch, j), append(nums, l.n)
				if len(batch) == batchSize {
					timer.Stop()
					flush()
				}
			}
		}
	}
	if !interrupted {
		flush()
	}
	p.finish()
	switch {
	case interrupted:
		fmt.Fprintf(e.stdout, "interrupted after line %d of %s: enqueued %d jobs, %d failed; the lines after %d were not enqueued\n", last, name, done, failed, last)
		return exitFailure
	case readErr != nil:
		fmt.Fprintf(e.stderr, "enqueue: cannot read %s after line %d: %v\n", name, last, readErr)
		fmt.Fprintf(e.stdout, "enqueued %d of %d jobs from %s in %s%s; the lines after %d were not read\n", done, done+failed, name, elapsed(start, done), failedNote(failed), last)
		return exitFailure
	}
	fmt.Fprintf(e.stdout, "enqueued %d of %d jobs from %s in %s%s\n", done, done+failed, name, elapsed(start, done), failedNote(failed))
	if failed > 0 {
		return exitFailure
	}
	return exitOK
}

// readLines sends the lines of in, numbered from 1, until the end, an
// error or quit.
func readLines(in io.Reader, out chan<- rawLine, quit <-chan struct{}) {
	defer close(out)
	r := bufio.NewReaderSize(in, 64<<10)
	for n := 1; ; n++ {
		b, err := r.ReadBytes('\n')
		if len(b) > 0 {
			select {
			case out <- rawLine{n: n, b: b}:
			case <-quit:
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				select {
				case out <- rawLine{err: err}:
				case <-quit:
				}
			}
			return
		}
	}
}

// countLines counts the non-blank lines of a regular file, for the
// progress display's total, and rewinds it; -1 when in is not one.
func countLines(in io.Reader) int64 {
	f, ok := in.(*os.File)
	if !ok {
		return -1
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return -1
	}
	var n int64
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<30)
	for s.Scan() {
		if len(bytes.TrimSpace(s.Bytes())) > 0 {
			n++
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil || s.Err() != nil {
		return -1
	}
	return n
}
