package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/internal/human"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/taskspec"
)

// line is one JSON line of --file. Absent fields take the job flags'
// values.
type line struct {
	Tenant    string          `json:"tenant"`
	Type      string          `json:"type"`
	Payload   json.RawMessage `json:"payload"`
	Queue     *string         `json:"queue"`
	Cost      *int64          `json:"cost"`
	Priority  *string         `json:"priority"`
	Pools     []string        `json:"pools"`
	Key       *string         `json:"key"`
	ID        *string         `json:"id"`
	ProcessIn *string         `json:"process_in"`
	MaxRetry  *int            `json:"max_retry"`
}

const knownFields = "tenant, type, payload, queue, cost, priority, key, pools, id, process_in, max_retry"

// jobContent is what a line enqueues, every default filled in: the id of
// a line without one is derived from it. The priority is left out: the
// same job at another priority is the same job (a line whose priority
// changed is not enqueued twice; sluice jobs prioritize moves the job
// already waiting).
type jobContent struct {
	Tenant    string          `json:"tenant"`
	Type      string          `json:"type"`
	Payload   json.RawMessage `json:"payload,omitempty"`
	Queue     string          `json:"queue"`
	Cost      int64           `json:"cost"`
	Key       string          `json:"key,omitempty"`
	ProcessIn time.Duration   `json:"process_in,omitempty"`
	MaxRetry  *int            `json:"max_retry,omitempty"`
}

// fileJob is one good line of --file.
type fileJob struct {
	job queue.Job
	// id is the line's task id, or "" when it gives none; content is then
	// what the job is, to derive its id from.
	id       string
	queue    string
	priority taskspec.Priority
	content  []byte
}

// parseLine turns one line into a job, with the flags as defaults.
func (o *options) parseLine(b []byte) (fileJob, error) {
	b = bytes.TrimRight(b, "\r\n")
	var l line
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return fileJob{}, lineJSONError(b, err)
	}
	if dec.More() {
		return fileJob{}, errors.New("more than one JSON value on the line; put one job on each line")
	}
	if bytes.TrimSpace(b)[0] != '{' {
		return fileJob{}, errors.New("not a JSON object; want {\"tenant\": …, \"type\": …, \"payload\": …}")
	}
	c := jobContent{Tenant: l.Tenant, Type: l.Type, Queue: o.queue, Cost: o.cost, ProcessIn: o.in}
	if c.Tenant == "" {
		if o.tenant == "" {
			return fileJob{}, errors.New("no tenant: add \"tenant\" to the line or give --tenant")
		}
		c.Tenant = o.tenant
	}
	if err := names.Tenant(c.Tenant); err != nil {
		return fileJob{}, err
	}
	if c.Type == "" {
		if o.typ == "" {
			return fileJob{}, errors.New("no type: add \"type\" to the line or give --type")
		}
		c.Type = o.typ
	}
	if l.Queue != nil {
		if strings.TrimSpace(*l.Queue) == "" {
			return fileJob{}, fmt.Errorf("queue %q: the queue name must not be blank; leave \"queue\" out for %q", *l.Queue, o.queue)
		}
		c.Queue = *l.Queue
	}
	if l.Cost != nil {
		if *l.Cost < 1 {
			return fileJob{}, fmt.Errorf("cost %d: must be at least 1 (the default)", *l.Cost)
		}
		c.Cost = *l.Cost
	}
	if l.ProcessIn != nil {
		d, err := time.ParseDuration(*l.ProcessIn)
		if err != nil || d < 0 {
			return fileJob{}, fmt.Errorf("process_in %q: want a duration such as \"90s\" or \"5m\"", *l.ProcessIn)
		}
		c.ProcessIn = d
	}
	priority := o.priority
	if l.Priority != nil {
		p, err := taskspec.ParsePriority(*l.Priority)
		if err != nil {
			return fileJob{}, fmt.Errorf("priority %q: must be \"high\", \"normal\" or \"low\"; leave \"priority\" out for %s", *l.Priority, o.priority)
		}
		priority = p
	}
	c.Key = o.key
	if l.Key != nil {
		if err := names.Key(*l.Key); err != nil {
			return fileJob{}, fmt.Errorf("key: %v; leave \"key\" out for none", err)
		}
		c.Key = *l.Key
	}
	pools := o.pools
	if l.Pools != nil {
		pools = nil
		for _, p := range l.Pools {
			if err := names.Pool(p); err != nil {
				return fileJob{}, fmt.Errorf("pools: %v", err)
			}
			if !slices.Contains(pools, p) {
				pools = append(pools, p)
			}
		}
	}
	id := ""
	if l.ID != nil {
		if strings.TrimSpace(*l.ID) == "" {
			return fileJob{}, fmt.Errorf("id %q: the task id must not be blank; leave \"id\" out for one derived from the line", *l.ID)
		}
		id = *l.ID
	}
	maxRetry, maxRetrySet := o.maxRetry, o.maxRetrySet
	if l.MaxRetry != nil {
		if *l.MaxRetry < 0 {
			return fileJob{}, fmt.Errorf("max_retry %d: must be 0 or more", *l.MaxRetry)
		}
		maxRetry, maxRetrySet = *l.MaxRetry, true
	}
	if maxRetrySet {
		c.MaxRetry = &maxRetry
	}
	if len(l.Payload) > 0 && string(l.Payload) != "null" {
		c.Payload = l.Payload
	}
	fj := fileJob{
		job:      queue.Job{Tenant: c.Tenant, Task: asynq.NewTask(c.Type, c.Payload), Options: jobOptions(c.Queue, c.Cost, priority, c.Key, pools, c.ProcessIn, id, maxRetry, maxRetrySet)},
		id:       id,
		queue:    c.Queue,
		priority: priority,
	}
	if id == "" {
		var compact bytes.Buffer
		if json.Compact(&compact, c.Payload) == nil {
			c.Payload = compact.Bytes()
		}
		fj.content, _ = json.Marshal(c)
	}
	return fj, nil
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
	if bytes.HasPrefix(b, utf8BOM) {
		return errors.New("not valid JSON: the line starts with a byte order mark (U+FEFF); only the file's first line may have one")
	}
	return fmt.Errorf("not valid JSON: %s", jsonProblem(b))
}

// utf8BOM is the byte order mark some editors write at the start of a file.
var utf8BOM = []byte("\xef\xbb\xbf")

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

// lineParser reads the lines of one file, in order. It refuses a task id
// an earlier line gave in the same queue (asynq would refuse the job; this
// names the line), and gives each line without an id one derived from
// what the line enqueues and from how many lines before it enqueue exactly
// the same: running a file again (after fixing a bad line, after an
// interrupt, by mistake) does not enqueue its jobs twice while they are in
// the queue, lines added or moved keep the ids of the others, and
// identical lines are still distinct jobs.
type lineParser struct {
	o      *options
	ids    map[[2]string]int // queue and task id → the line that gave them
	copies map[[sha256.Size]byte]int
}

func newLineParser(o *options) *lineParser {
	return &lineParser{o: o, ids: map[[2]string]int{}, copies: map[[sha256.Size]byte]int{}}
}

// parse reads line n (not blank) into a job with its task id.
func (lp *lineParser) parse(n int, b []byte) (fileJob, error) {
	if n == 1 {
		b = bytes.TrimPrefix(b, utf8BOM)
	}
	fj, err := lp.o.parseLine(b)
	if err != nil {
		return fj, err
	}
	if fj.id != "" {
		k := [2]string{fj.queue, fj.id}
		if first, ok := lp.ids[k]; ok {
			return fileJob{}, fmt.Errorf("id %q: line %d already gave this task id in queue %q; task ids must be unique", fj.id, first, fj.queue)
		}
		lp.ids[k] = n
		return fj, nil
	}
	if lp.o.randomIDs {
		return fj, nil
	}
	sum := sha256.Sum256(fj.content)
	lp.copies[sum]++
	fj.id = derivedID(sum, lp.copies[sum])
	fj.job.Options = append(fj.job.Options, asynq.TaskID(fj.id))
	return fj, nil
}

// derivedID is the task id of the copy-th line (from 1) of a file that
// enqueues the job whose content hashes to sum.
func derivedID(sum [sha256.Size]byte, copy int) string {
	h := sha256.New()
	h.Write(sum[:])
	h.Write([]byte(strconv.Itoa(copy)))
	return "line-" + hex.EncodeToString(h.Sum(nil)[:16])
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

// file enqueues the jobs of the JSON lines read from in: all of them, or
// none when a line is bad (--partial: every good line). --dry-run only
// checks and shows them.
func (e *enqueuer) file(ctx context.Context, in io.Reader, name string) int {
	if e.o.partial && !e.o.dryRun {
		return e.stream(ctx, in, name, -1)
	}
	f, err := rewindable(ctx, in)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(e.stderr, "enqueue: interrupted while reading %s: nothing was enqueued\n", name)
		} else {
			fmt.Fprintf(e.stderr, "enqueue: cannot read %s: %v; nothing was enqueued\n", name, err)
		}
		return exitFailure
	}
	defer f.close()
	good, bad, err := e.check(ctx, f, name)
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(e.stderr, "enqueue: interrupted while checking %s: nothing was enqueued\n", name)
		return exitFailure
	case err != nil:
		fmt.Fprintf(e.stderr, "enqueue: cannot read %s: %v; nothing was enqueued\n", name, err)
		return exitFailure
	case bad > 0 && e.o.dryRun:
		fmt.Fprintf(e.stdout, "dry run: %d of %s of %s %s bad (reported above); the other %d %s good; nothing was enqueued\n", bad, human.Count(good+bad, "line", "lines"), name, plural(bad, "is", "are"), good, plural(good, "is", "are"))
		return exitFailure
	case bad > 0:
		fmt.Fprintf(e.stderr, "enqueue: %d of %s of %s %s bad (reported above): nothing was enqueued; fix %s and run again (--partial enqueues the good lines and reports the bad ones)\n", bad, human.Count(good+bad, "line", "lines"), name, plural(bad, "is", "are"), plural(bad, "it", "them"))
		return exitFailure
	case e.o.dryRun:
		fmt.Fprintf(e.stdout, "dry run: the %d %s of %s would be enqueued; nothing was enqueued\n", good, plural(good, "job", "jobs"), name)
		return exitOK
	}
	if err := f.rewind(); err != nil {
		fmt.Fprintf(e.stderr, "enqueue: cannot read %s again: %v; nothing was enqueued\n", name, err)
		return exitFailure
	}
	return e.stream(ctx, f, name, int64(good))
}

// check reads every line of in, reports each bad one on stderr and, for a
// dry run, each good one on stdout; it returns how many are good and bad.
func (e *enqueuer) check(ctx context.Context, in io.Reader, name string) (good, bad int, err error) {
	lp := newLineParser(e.o)
	r := bufio.NewReaderSize(in, 64<<10)
	for n := 1; ctx.Err() == nil; n++ {
		b, rerr := r.ReadBytes('\n')
		if len(bytes.TrimSpace(bytes.TrimPrefix(b, utf8BOM))) > 0 {
			fj, perr := lp.parse(n, b)
			switch {
			case perr != nil:
				bad++
				fmt.Fprintf(e.stderr, "enqueue: line %d: %s\n", n, perr)
			case e.o.dryRun && !e.o.quiet:
				good++
				fmt.Fprintf(e.stdout, "line %d: %s\n", n, describeJob(fj))
			default:
				good++
			}
		}
		if errors.Is(rerr, io.EOF) {
			return good, bad, nil
		}
		if rerr != nil {
			return good, bad, rerr
		}
	}
	return good, bad, ctx.Err()
}

// describeJob says what a line would enqueue, for --dry-run.
func describeJob(fj fileJob) string {
	return fmt.Sprintf("task %s (type %s, tenant %s, queue %s%s)", fj.id, fj.job.Task.Type(), fj.job.Tenant, fj.queue, priorityNote(fj.priority))
}

// stream enqueues the jobs of the lines of in as they are read, in
// batches; a bad line is reported and skipped. total is the number of jobs
// for the progress display, -1 to count them when in is a file.
func (e *enqueuer) stream(ctx context.Context, in io.Reader, name string, total int64) int {
	if total < 0 && !e.o.quiet {
		total = countLines(in)
	}
	p := e.progress(total)
	start := time.Now()

	lines := make(chan rawLine, batchSize)
	quit := make(chan struct{})
	defer close(quit)
	go readLines(in, lines, quit)

	var (
		done, failed, already, last int
		readErr                     error
		interrupted                 bool
		batch                       []queue.Job
		nums                        []int
		lp                          = newLineParser(e.o)
	)
	flush := func() {
		if len(batch) == 0 {
			return
		}
		for i, r := range e.client.EnqueueBatch(context.WithoutCancel(ctx), batch) {
			switch {
			case errors.Is(r.Err, asynq.ErrTaskIDConflict):
				already++
			case r.Err != nil:
				failed++
				p.note(fmt.Sprintf("enqueue: line %d: %s", nums[i], explain(r.Err)))
			default:
				done++
			}
		}
		last = nums[len(nums)-1]
		batch, nums = batch[:0], nums[:0]
		p.add(done+already, failed)
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
			case len(bytes.TrimSpace(bytes.TrimPrefix(l.b, utf8BOM))) == 0:
				if len(batch) == 0 {
					last = l.n
				}
			default:
				fj, err := lp.parse(l.n, l.b)
				if err != nil {
					failed++
					p.note(fmt.Sprintf("enqueue: line %d: %s", l.n, err))
					if len(batch) == 0 {
						last = l.n
						p.add(done+already, failed)
					}
					break
				}
				if len(batch) == 0 {
					timer.Reset(flushAfter)
				}
				batch, nums = append(batch, fj.job), append(nums, l.n)
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
	rerun := ""
	if !e.o.randomIDs {
		rerun = "; run the same file again to enqueue the rest (the jobs already enqueued are skipped)"
	}
	switch {
	case interrupted:
		fmt.Fprintf(e.stdout, "interrupted after line %d of %s: enqueued %s, %d failed%s; the lines after %d were not enqueued%s\n", last, name, human.Count(done, "job", "jobs"), failed, alreadyNote(already), last, rerun)
		return exitFailure
	case readErr != nil:
		fmt.Fprintf(e.stderr, "enqueue: cannot read %s after line %d: %v\n", name, last, readErr)
		fmt.Fprintf(e.stdout, "enqueued %d of %s from %s in %s%s%s; the lines after %d were not read\n", done, human.Count(done+failed+already, "job", "jobs"), name, elapsed(start, done), failedNote(failed), alreadyNote(already), last)
		return exitFailure
	}
	fmt.Fprintf(e.stdout, "enqueued %d of %s from %s in %s%s%s\n", done, human.Count(done+failed+already, "job", "jobs"), name, elapsed(start, done), failedNote(failed), alreadyNote(already))
	if failed > 0 {
		return exitFailure
	}
	return exitOK
}

// alreadyNote counts the jobs whose task id was in the queue already.
func alreadyNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d %s in the queue already (the same task id: enqueued before), not enqueued again", n, plural(n, "was", "were"))
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
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

// rewindFile is input that can be read twice: the file itself, or what
// was read from a pipe, kept in a temporary file.
type rewindFile struct {
	*os.File
	temp bool
}

// rewindable returns in as a file that can be read again: a regular file
// as it is, anything else (standard input) copied first to a temporary
// file, until its end or until ctx ends.
func rewindable(ctx context.Context, in io.Reader) (*rewindFile, error) {
	if f, ok := in.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
			return &rewindFile{File: f}, nil
		}
	}
	tmp, err := os.CreateTemp("", "enqueue-*.jsonl")
	if err != nil {
		return nil, err
	}
	rf := &rewindFile{File: tmp, temp: true}
	copied := make(chan error, 1)
	go func() {
		_, err := io.Copy(tmp, in)
		copied <- err
	}()
	select {
	case err = <-copied:
	case <-ctx.Done():
		// The copy ends when the input does (or with the process); the
		// temporary file is already gone then.
		err = ctx.Err()
	}
	if err == nil {
		err = rf.rewind()
	}
	if err != nil {
		rf.close()
		return nil, err
	}
	return rf, nil
}

func (f *rewindFile) rewind() error {
	_, err := f.Seek(0, io.SeekStart)
	return err
}

// close removes a temporary copy; the caller closes a file it opened.
func (f *rewindFile) close() {
	if f.temp {
		_ = f.Close()
		_ = os.Remove(f.Name())
	}
}
