package worker_test

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// adaptPlot draws a run of TestAdaptiveConvergence as an SVG: the real
// limit, the adapted limit, the achieved rate and the 429s over time.
type adaptPlot struct {
	begin, finish time.Time
	phases        []adaptPhaseSpec
	starts        []time.Time
	log           []answer
	samples       []adaptSample
	policy        string
}

func (p adaptPlot) svg() string {
	const (
		w, h                   = 960, 480
		left, right, top, bot  = 60, 20, 50, 80
		bucket                 = 500 * time.Millisecond
		colReal, colAdapt      = "#444", "#1f6fd1"
		colAchieved, colRefuse = "#2a9d3a", "#d62828"
	)
	span := p.finish.Sub(p.begin).Seconds()
	n := int(p.finish.Sub(p.begin) / bucket) // whole buckets only
	ok, refused := make([]float64, n), make([]float64, n)
	for _, a := range p.log {
		if a.at.Before(p.begin) {
			continue
		}
		if i := int(a.at.Sub(p.begin) / bucket); i < n {
			if a.ok {
				ok[i] += 1 / bucket.Seconds()
			} else {
				refused[i] += 1 / bucket.Seconds()
			}
		}
	}
	top_ := 0.0
	for _, ph := range p.phases {
		top_ = max(top_, ph.limit)
	}
	for _, s := range p.samples {
		top_ = max(top_, float64(s.limit))
	}
	for i := range n {
		top_ = max(top_, ok[i], refused[i])
	}
	ymax := math.Ceil(top_*1.1/10) * 10
	x := func(sec float64) float64 { return left + sec/span*(w-left-right) }
	y := func(v float64) float64 { return h - bot - v/ymax*(h-top-bot) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14" font-weight="bold">sluice adaptive limit against a downstream that only answers 429 (2 workers)</text>`+"\n", left)
	fmt.Fprintf(&b, `<text x="%d" y="38" fill="#555">policy: %s · downstream: strict token bucket, burst 2</text>`+"\n", left, xmlEscape(p.policy))
	// grid and axes
	stepY := 10.0
	if ymax > 120 {
		stepY = 20
	}
	for v := 0.0; v <= ymax; v += stepY {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/><text x="%d" y="%.1f" text-anchor="end" fill="#555">%.0f</text>`+"\n", left, w-right, y(v), y(v), left-6, y(v)+4, v)
	}
	stepX := 2.0
	if span > 40 {
		stepX = 10
	}
	for s := 0.0; s <= span; s += stepX {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#f0f0f0"/><text x="%.1f" y="%d" text-anchor="middle" fill="#555">%.0f</text>`+"\n", x(s), x(s), top, h-bot, x(s), h-bot+16, s)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#333">seconds</text>`+"\n", x(span/2), h-bot+34)
	fmt.Fprintf(&b, `<text x="16" y="%.1f" transform="rotate(-90 16 %.1f)" text-anchor="middle" fill="#333">requests per second</text>`+"\n", y(ymax/2), y(ymax/2))
	// 429s per second, as bars
	bw := x(bucket.Seconds()) - x(0)
	for i := range n {
		if refused[i] > 0 {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="0.55"/>`+"\n", x(float64(i)*bucket.Seconds()), y(refused[i]), bw-1, y(0)-y(refused[i]), colRefuse)
		}
	}
	// the real limit, a step line
	var real []string
	for i, ph := range p.phases {
		from := p.starts[i].Sub(p.begin).Seconds()
		to := span
		if i+1 < len(p.starts) {
			to = p.starts[i+1].Sub(p.begin).Seconds()
		}
		real = append(real, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", x(from), y(ph.limit), x(to), y(ph.limit)))
	}
	fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2" stroke-dasharray="6 4"/>`+"\n", strings.Join(real, " "), colReal)
	// the achieved rate (answered 2xx per second, in half-second buckets)
	var ach []string
	for i := range n {
		ach = append(ach, fmt.Sprintf("%.1f,%.1f", x((float64(i)+0.5)*bucket.Seconds()), y(ok[i])))
	}
	fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(ach, " "), colAchieved)
	// the adapted limit, as sampled
	var ad []string
	for i, s := range p.samples {
		if i > 0 {
			ad = append(ad, fmt.Sprintf("%.1f,%.1f", x(s.at.Sub(p.begin).Seconds()), y(float64(p.samples[i-1].limit))))
		}
		ad = append(ad, fmt.Sprintf("%.1f,%.1f", x(s.at.Sub(p.begin).Seconds()), y(float64(s.limit))))
	}
	fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(ad, " "), colAdapt)
	// legend
	lx, ly := float64(left), float64(h-16)
	for i, it := range []struct{ col, name, dash string }{
		{colReal, "real limit", "6 4"}, {colAdapt, "adapted limit", ""}, {colAchieved, "achieved (2xx/s)", ""}, {colRefuse, "429s per second", ""},
	} {
		xx := lx + float64(i)*170
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="3" stroke-dasharray="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n", xx, xx+24, ly, ly, it.col, it.dash, xx+30, ly+4, it.name)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
