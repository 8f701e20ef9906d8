package main

import (
	"os"
	"regexp"
	"strconv"
	"strings"
)

// previous is what the report this run replaces said about sluice: the
// figures some targets compare with ("not lower than the previous run").
// The report is read before it is rewritten.
type previous struct {
	Found       bool
	Began       string  // when that run was made, as its report says
	Jobs        int     // jobs enqueued: only a run of the same workload compares
	JobsPerSec  float64 // sluice's fleet jobs/s
	RedisPerJob float64 // sluice's Redis CPU seconds per completed job
}

// readPrevious reads the previous run's figures from the report file;
// Found is false when there is none or it does not hold them.
func readPrevious(file string) previous {
	b, err := os.ReadFile(file)
	if err != nil {
		return previous{}
	}
	return parsePrevious(string(b))
}

var (
	madeRe  = regexp.MustCompile(`from one real run, ([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2} [A-Z]+)`)
	leadNum = regexp.MustCompile(`^[0-9][0-9,]*(\.[0-9]+)?`)
)

// parsePrevious reads sluice's column of the results table of a report.
func parsePrevious(md string) previous {
	var prev previous
	if m := madeRe.FindStringSubmatch(md); m != nil {
		prev.Began = m[1]
	}
	col := -1
	cells := map[string]string{}
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "|") {
			if col >= 0 && len(cells) > 0 {
				break // the results table is over
			}
			continue
		}
		f := strings.Split(strings.Trim(line, "|"), "|")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		if col < 0 {
			for i, c := range f {
				if c == setupTitle(setupSluice) && i > 0 {
					col = i
				}
			}
			continue
		}
		if col < len(f) {
			cells[f[0]] = f[col]
		}
	}
	num := func(row string) (float64, bool) {
		m := leadNum.FindString(cells[row])
		if m == "" {
			return 0, false
		}
		v, err := strconv.ParseFloat(strings.ReplaceAll(m, ",", ""), 64)
		return v, err == nil
	}
	jobs, ok1 := num("jobs enqueued (of workload)")
	completed, ok2 := num("jobs completed (2xx)")
	jps, ok3 := num("fleet jobs/s (completed / time to last)")
	if !ok1 || !ok2 || !ok3 {
		return previous{}
	}
	prev.Found, prev.Jobs, prev.JobsPerSec = true, int(jobs), jps
	if us, ok := num("Redis CPU per completed job"); ok {
		prev.RedisPerJob = us / 1e6
	} else if cpu, ok := num("Redis CPU / peak memory"); ok && completed > 0 {
		// reports before the per-job row: Redis CPU seconds over the run
		prev.RedisPerJob = cpu / completed
	}
	return prev
}

// comparable reports whether the previous run had the same workload.
func (p previous) comparable(jobs int) bool { return p.Found && p.Jobs == jobs }

// since is how the report names the previous run.
func (p previous) since() string {
	if p.Began == "" {
		return "the previous run"
	}
	return "the previous run (" + p.Began + ")"
}
