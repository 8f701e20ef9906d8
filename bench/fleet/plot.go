package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"sort"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
}

var gray = color.RGBA{R: 0x80, G: 0x80, B: 0x80, A: 0xff}

// plotTenants picks the small tenants whose arrivals are plotted: rate
// limited ones with the longest backlog under their own limit, with
// different limits where possible.
func plotTenants(w *workload, n int) []int {
	var cands []int
	for _, t := range w.tenants {
		if t.class == classRate {
			cands = append(cands, t.id)
		}
	}
	load := func(i int) float64 { return float64(w.tenants[i].jobs) / float64(w.tenants[i].rate) }
	sort.Slice(cands, func(a, b int) bool { return load(cands[a]) > load(cands[b]) })
	var out []int
	seen := map[int64]bool{}
	for _, i := range cands {
		if len(out) < n && !seen[w.tenants[i].rate] {
			out = append(out, i)
			seen[w.tenants[i].rate] = true
		}
	}
	for _, i := range cands {
		if len(out) >= n {
			break
		}
		if !contains(out, i) {
			out = append(out, i)
		}
	}
	return out
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// perSecond buckets arrivals of the given status (or all, when status is
// nil) into 1 s bins from 0 to end.
func perSecond(arr []arrival, end time.Duration, keep func(uint8) bool) plotter.XYs {
	n := int(end/time.Second) + 1
	bins := make([]float64, n)
	for _, a := range arr {
		if keep(a.status) {
			if k := int(a.at / time.Second); k >= 0 && k < n {
				bins[k]++
			}
		}
	}
	xy := make(plotter.XYs, n)
	for k := range bins {
		xy[k].X, xy[k].Y = float64(k)+0.5, bins[k]
	}
	return xy
}

func isAccepted(s uint8) bool { return s == accepted }
func isRejected(s uint8) bool { return s != accepted }

func line(p *plot.Plot, xy plotter.XYs, c color.Color, dashed bool, name string) error {
	l, err := plotter.NewLine(xy)
	if err != nil {
		return err
	}
	l.Color = c
	l.Width = vg.Points(1)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	p.Add(l)
	if name != "" {
		p.Legend.Add(name, l)
	}
	return nil
}

func limitLine(end time.Duration, y float64) plotter.XYs {
	return plotter.XYs{{X: 0, Y: y}, {X: end.Seconds(), Y: y}}
}

// plotArrivals draws one set-up's arrivals per second: the big tenant on
// top, a few small tenants below, accepted and rejected requests apart,
// with the limits dashed.
func plotArrivals(w *workload, rd *runData, small []int, end time.Duration, file string) error {
	top := plot.New()
	big := w.tenants[0]
	top.Title.Text = fmt.Sprintf("%s: big tenant %s (rate=%d/s, %s jobs at t=%.0fs)", setupTitle(rd.setup), big.name, big.rate, thousands(int64(big.jobs)), w.cfg.bigAt.Seconds())
	top.X.Label.Text = "time since start (s)"
	top.Y.Label.Text = "requests/s at the downstream"
	top.Legend.Top = true
	if err := line(top, perSecond(rd.arrivals[0], end, isAccepted), palette[0], false, "accepted"); err != nil {
		return err
	}
	if err := line(top, perSecond(rd.arrivals[0], end, isRejected), palette[1], false, "rejected (429)"); err != nil {
		return err
	}
	if err := line(top, limitLine(end, float64(big.rate)), gray, true, "limit"); err != nil {
		return err
	}
	top.Y.Min = 0

	bottom := plot.New()
	bottom.Title.Text = "small tenants (accepted/s; their limits dashed; all their 429s in gray)"
	bottom.X.Label.Text = "time since start (s)"
	bottom.Y.Label.Text = "requests/s"
	bottom.Legend.Top = true
	var rejected []arrival
	for k, ti := range small {
		t := w.tenants[ti]
		c := palette[(k+2)%len(palette)]
		if err := line(bottom, perSecond(rd.arrivals[ti], end, isAccepted), c, false, fmt.Sprintf("%s rate=%d/s", t.name, t.rate)); err != nil {
			return err
		}
		if err := line(bottom, limitLine(end, float64(t.rate)), c, true, ""); err != nil {
			return err
		}
		rejected = append(rejected, rd.arrivals[ti]...)
	}
	if err := line(bottom, perSecond(rejected, end, isRejected), gray, false, "rejected (429)"); err != nil {
		return err
	}
	bottom.Y.Min = 0
	for _, p := range []*plot.Plot{top, bottom} {
		p.X.Min, p.X.Max = 0, end.Seconds()
	}
	return savePlots(file, [][]*plot.Plot{{top}, {bottom}}, 10*vg.Inch, 8*vg.Inch)
}

// plotWaits draws the distribution (CDF, log scale) of the small tenants'
// queue waits during the big burst, one line per set-up, with the target
// p99 dashed.
func plotWaits(results []*result, title string, target time.Duration, file string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "enqueue → start at the downstream (s, log scale)"
	p.Y.Label.Text = "fraction of jobs waiting at most this long"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Legend.Left = true
	const floor = 0.001 // 1 ms: the log axis needs positive values
	maxX := 10.0
	for k, r := range results {
		if len(r.waits) == 0 {
			continue
		}
		xy := make(plotter.XYs, 0, len(r.waits))
		for i, d := range r.waits {
			xy = append(xy, plotter.XY{X: math.Max(d.Seconds(), floor), Y: float64(i+1) / float64(len(r.waits))})
		}
		maxX = math.Max(maxX, xy[len(xy)-1].X)
		if err := line(p, xy, palette[k%len(palette)], false, fmt.Sprintf("%s (p99 %s)", setupTitle(r.setup), secs(r.waitP99))); err != nil {
			return err
		}
	}
	tx := target.Seconds()
	if err := line(p, plotter.XYs{{X: tx, Y: 0}, {X: tx, Y: 1}}, gray, true, secs(target)+" target (p99)"); err != nil {
		return err
	}
	p.X.Min, p.X.Max = floor, maxX*1.2
	p.Y.Min, p.Y.Max = 0, 1
	return savePlots(file, [][]*plot.Plot{{p}}, 10*vg.Inch, 5*vg.Inch)
}

func savePlots(file string, plots [][]*plot.Plot, w, h vg.Length) error {
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(plots), Cols: len(plots[0]), PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		for j := range plots[i] {
			plots[i][j].Draw(canvases[i][j])
		}
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", file, err)
	}
	return f.Close()
}

// plotQueues draws, per set-up, the pending list's length and Redis's CPU
// (share of one core, over 5 s) through the run.
func plotQueues(runs []*runData, end time.Duration, file string) error {
	pend := plot.New()
	pend.Title.Text = "asynq's pending list (tasks due and waiting for a worker)"
	pend.X.Label.Text = "time since start (s)"
	pend.Y.Label.Text = "tasks"
	pend.Legend.Top = true
	cpu := plot.New()
	cpu.Title.Text = "Redis CPU (share of one core, 5 s average)"
	cpu.X.Label.Text = "time since start (s)"
	cpu.Y.Label.Text = "share of one core"
	cpu.Legend.Top = true
	for k, rd := range runs {
		c := palette[k%len(palette)]
		xy := make(plotter.XYs, 0, len(rd.samples))
		for _, s := range rd.samples {
			xy = append(xy, plotter.XY{X: s.At.Seconds(), Y: float64(s.Pending)})
		}
		var busy plotter.XYs
		j := 0
		for i, s := range rd.samples {
			for j < i && s.At-rd.samples[j].At > 5*time.Second {
				j++
			}
			if d := (s.At - rd.samples[j].At).Seconds(); d > 0 {
				busy = append(busy, plotter.XY{X: s.At.Seconds(), Y: (s.RedisCPU - rd.samples[j].RedisCPU) / d})
			}
		}
		if len(xy) > 1 {
			if err := line(pend, xy, c, false, setupTitle(rd.setup)); err != nil {
				return err
			}
		}
		if len(busy) > 1 {
			if err := line(cpu, busy, c, false, setupTitle(rd.setup)); err != nil {
				return err
			}
		}
	}
	for _, p := range []*plot.Plot{pend, cpu} {
		p.X.Min, p.X.Max, p.Y.Min = 0, end.Seconds(), 0
	}
	cpu.Y.Max = 1.05
	return savePlots(file, [][]*plot.Plot{{pend}, {cpu}}, 10*vg.Inch, 8*vg.Inch)
}
