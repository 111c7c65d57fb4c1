package main

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strconv"
	"strings"
)

// A plot is hand-written SVG: zones on a log x axis, the figure on a log y axis, one line per
// server and resource count (colour: the server; dash: the resources).

var serverColour = map[server]string{holdsOn: "#d62728", holdsOff: "#1f77b4", stock: "#2ca02c",
	guarded: "#9467bd", stockSotW: "#8c564b", guardSotW: "#e377c2", floorOnly: "#7f7f7f", noAuth: "#ff7f0e"}

var serverLabel = map[server]string{
	holdsOn:   "kds-host, holds on (default)",
	holdsOff:  "kds-host, holds off",
	stock:     "stock go-control-plane",
	guarded:   "guard over stock's caches",
	stockSotW: "stock go-control-plane, SotW",
	guardSotW: "guard over stock's caches, SotW",
	floorOnly: "grpc-go alone, no cache (floor)",
	noAuth:    "kds-host, holds on, no zone tokens",
}

type point struct{ x, y float64 }

type series struct {
	label  string
	colour string
	dash   string
	points []point
}

func (r *report) plot(title string, subtitle []string, unit string, get func(figures) float64) string {
	var resourceCounts []int
	for _, res := range r.Results {
		if !slices.Contains(resourceCounts, res.Resources) {
			resourceCounts = append(resourceCounts, res.Resources)
		}
	}
	slices.Sort(resourceCounts)
	dashes := []string{"", "8 5", "2 4", "12 4 2 4"}
	var all []series
	for _, sv := range knownServers {
		for i, n := range resourceCounts {
			s := series{label: fmt.Sprintf("%s, %d res.", serverLabel[sv], n), colour: serverColour[sv], dash: dashes[i%len(dashes)]}
			for _, res := range r.Results {
				if res.Server == sv && res.Resources == n {
					if v := get(res.Median); v > 0 {
						s.points = append(s.points, point{float64(res.Zones), v})
					}
				}
			}
			if len(s.points) > 0 {
				slices.SortFunc(s.points, func(a, b point) int { return int(a.x - b.x) })
				all = append(all, s)
			}
		}
	}
	return svgPlot(title, subtitle, "zones", unit, all)
}

const (
	plotW, plotH              = 900, 480
	marginL, marginR, marginT = 80, 280, 70
	marginB                   = 60
)

func svgPlot(title string, subtitle []string, xLabel, yUnit string, all []series) string {
	var xs, ys []float64
	for _, s := range all {
		for _, p := range s.points {
			xs, ys = append(xs, p.x), append(ys, p.y)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH, plotW, plotH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="16" font-weight="bold">%s</text>`+"\n", marginL, html.EscapeString(title))
	for i, line := range subtitle {
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="10" fill="#555">%s</text>`+"\n", marginL, 38+12*i, html.EscapeString(line))
	}
	if len(xs) == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d">no figures</text>`+"\n</svg>\n", marginL, plotH/2)
		return b.String()
	}
	x0, x1 := logRange(xs)
	y0, y1 := logRange(ys)
	w, h := float64(plotW-marginL-marginR), float64(plotH-marginT-marginB)
	px := func(x float64) float64 {
		return float64(marginL) + w*(math.Log10(x)-math.Log10(x0))/(math.Log10(x1)-math.Log10(x0))
	}
	py := func(y float64) float64 {
		return float64(marginT) + h - h*(math.Log10(y)-math.Log10(y0))/(math.Log10(y1)-math.Log10(y0))
	}
	// Axes and grid.
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", marginL, marginT, w, h)
	for _, t := range logTicks(x0, x1) {
		x := px(t.v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x, marginT, x, float64(marginT)+h)
		if t.label {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, float64(marginT)+h+16, fmtNum(t.v))
		}
	}
	for _, t := range logTicks(y0, y1) {
		y := py(t.v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", marginL, y, float64(marginL)+w, y)
		if t.label {
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginL-6, y+4, fmtNum(t.v))
		}
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s (log scale)</text>`+"\n", float64(marginL)+w/2, plotH-16, html.EscapeString(xLabel))
	fmt.Fprintf(&b, `<text x="18" y="%.1f" text-anchor="middle" transform="rotate(-90 18 %.1f)">%s (log scale)</text>`+"\n",
		float64(marginT)+h/2, float64(marginT)+h/2, html.EscapeString(yUnit))
	// Lines, points, values.
	for _, s := range all {
		var pts []string
		for _, p := range s.points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p.x), py(p.y)))
		}
		dash := ""
		if s.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, s.dash)
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), s.colour, dash)
		for _, p := range s.points {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`+"\n", px(p.x), py(p.y), s.colour)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="10" fill="%s" stroke="white" stroke-width="3" paint-order="stroke">%s</text>`+"\n", px(p.x)+6, py(p.y)-5, s.colour, fmtNum(p.y))
		}
	}
	// Legend.
	lx := float64(marginL) + w + 16
	for i, s := range all {
		y := float64(marginT) + 10 + float64(i)*20
		dash := ""
		if s.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, s.dash)
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", lx, y, lx+28, y, s.colour, dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="11">%s</text>`+"\n", lx+34, y+4, html.EscapeString(s.label))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// logRange is a range of whole decades (or, within one, of 1-2-5 steps) holding vs.
func logRange(vs []float64) (lo, hi float64) {
	lo, hi = slices.Min(vs), slices.Max(vs)
	steps := []float64{1, 2, 5, 10}
	down := func(v float64) float64 {
		d := math.Pow(10, math.Floor(math.Log10(v)))
		for i := len(steps) - 1; i >= 0; i-- {
			if steps[i]*d <= v {
				return steps[i] * d
			}
		}
		return d
	}
	up := func(v float64) float64 {
		d := math.Pow(10, math.Floor(math.Log10(v)))
		for _, s := range steps {
			if s*d >= v {
				return s * d
			}
		}
		return 10 * d
	}
	lo, hi = down(lo*0.9), up(hi*1.1)
	if hi/lo < 4 {
		lo, hi = down(lo/2), up(hi*2)
	}
	return lo, hi
}

type tick struct {
	v     float64
	label bool
}

// logTicks are 1, 2 and 5 times each power of ten within [lo, hi]; all are labelled when the
// range spans at most two decades, else the powers of ten only.
func logTicks(lo, hi float64) []tick {
	var out []tick
	few := math.Log10(hi/lo) <= 2.01
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo*0.999 && v <= hi*1.001 {
				out = append(out, tick{v, m == 1 || few})
			}
		}
	}
	return out
}

// fmtNum prints a number with about three significant digits.
func fmtNum(v float64) string {
	switch {
	case v == math.Round(v) && v < 1e6:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 100:
		return strconv.FormatFloat(math.Round(v), 'f', -1, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}
