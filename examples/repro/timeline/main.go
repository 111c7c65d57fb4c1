// Command timeline draws the timelines that examples/repro/two-cp.sh --timeline writes, one
// panel per mode, as one SVG: the zone's NACKs and the global's retry rounds over time, the
// outage, the apply and the moment the zone converged. compare.sh runs it per scenario.
//
//	go run ./examples/repro/timeline -o a-3s.svg -title "A. Mesh refused for 3s" FILE...
package main

import (
	"bufio"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// sample is one line of a timeline file: the counts at T (seconds since the zone started).
type sample struct {
	t                       float64
	timeouts, nacks, rounds int
}

// run is one mode's timeline file.
type run struct {
	label   string
	outages map[string]time.Duration // kind -> how long its admission was down from t=0
	samples []sample
	events  map[string]float64 // zone-up, rejection, applied, converged
}

func main() {
	out := flag.String("o", "", "the SVG file to write (default: stdout)")
	title := flag.String("title", "", "the chart's title")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: timeline [-o FILE.svg] [-title TEXT] TIMELINE-FILE...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	var runs []run
	for _, path := range flag.Args() {
		r, err := readFile(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "timeline:", err)
			os.Exit(1)
		}
		runs = append(runs, r)
	}
	w := io.Writer(os.Stdout)
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			fmt.Fprintln(os.Stderr, "timeline:", err)
			os.Exit(1)
		}
		defer f.Close()
		w = f
	}
	if err := draw(w, *title, runs); err != nil {
		fmt.Fprintln(os.Stderr, "timeline:", err)
		os.Exit(1)
	}
}

func readFile(path string) (run, error) {
	f, err := os.Open(path)
	if err != nil {
		return run{}, err
	}
	defer f.Close()
	r, err := parse(f)
	if err != nil {
		return run{}, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// parse reads a timeline: `# label=... outage=...`, then `t=S key=value...` lines.
func parse(rd io.Reader) (run, error) {
	r := run{outages: map[string]time.Duration{}, events: map[string]float64{}}
	sc := bufio.NewScanner(rd)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if head, ok := strings.CutPrefix(line, "#"); ok {
			head = strings.TrimSpace(head)
			// label=... may hold spaces: it runs up to " outage=".
			if rest, ok := strings.CutPrefix(head, "label="); ok {
				label, outage, _ := strings.Cut(rest, " outage=")
				r.label = label
				for _, o := range strings.Split(outage, ",") {
					kind, d, ok := strings.Cut(o, "=")
					if dur, err := time.ParseDuration(d); ok && err == nil {
						r.outages[kind] = dur
					}
				}
			}
			continue
		}
		var s sample
		var ev string
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			var err error
			switch k {
			case "t":
				s.t, err = strconv.ParseFloat(v, 64)
			case "timeouts":
				s.timeouts, err = strconv.Atoi(v)
			case "nacks":
				s.nacks, err = strconv.Atoi(v)
			case "rounds":
				s.rounds, err = strconv.Atoi(v)
			case "event":
				ev = v
			}
			if err != nil {
				return run{}, fmt.Errorf("line %d: %s: %w", n, f, err)
			}
		}
		if ev != "" {
			if _, seen := r.events[ev]; !seen {
				r.events[ev] = s.t
			}
			continue
		}
		r.samples = append(r.samples, s)
	}
	if err := sc.Err(); err != nil {
		return run{}, err
	}
	if _, ok := r.events["applied"]; !ok {
		return run{}, fmt.Errorf("no event=applied line: not a two-cp.sh --timeline file")
	}
	return r, nil
}

// converged is when the zone had ACKed 3 MeshTimeouts, in seconds since the apply.
func (r run) converged() (float64, bool) {
	applied := r.events["applied"]
	for _, s := range r.samples {
		if s.timeouts >= 3 && s.t >= applied {
			return s.t - applied, true
		}
	}
	if t, ok := r.events["converged"]; ok {
		return t - applied, true
	}
	return 0, false
}

func (r run) last() sample {
	if len(r.samples) == 0 {
		return sample{}
	}
	return r.samples[len(r.samples)-1]
}

const (
	width   = 960
	left    = 70
	right   = 170
	panelH  = 120
	panelGp = 34
	topH    = 64
	axisH   = 40
)

// draw writes the SVG: one panel per run, on one time axis (seconds since the apply).
func draw(w io.Writer, title string, runs []run) error {
	xmin, xmax := 0.0, 1.0
	for _, r := range runs {
		applied := r.events["applied"]
		xmin = math.Min(xmin, -applied)
		for _, s := range r.samples {
			xmax = math.Max(xmax, s.t-applied)
		}
	}
	xmax *= 1.02
	x := func(t float64) float64 { return left + (t-xmin)/(xmax-xmin)*(width-left-right) }
	height := topH + len(runs)*(panelH+panelGp) + axisH
	b := &strings.Builder{}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	esc := html.EscapeString

	p(`<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	p(`<text x="%d" y="22" font-size="16" font-weight="bold" fill="#1d2430">%s</text>`+"\n", left, esc(title))
	p(`<text x="%d" y="40" fill="#5d6778">seconds since the MeshTimeout was applied · red: the zone's NACKs, blue: the global's retry rounds (cumulative, each panel on its own scale)</text>`+"\n", left)
	p(`<text x="%d" y="56" fill="#5d6778">shaded: the zone's admission outage · dashed: the apply · green: the zone holds all 3 MeshTimeouts (converged)</text>`+"\n", left)
	step := tickStep(xmax - xmin)
	for i, r := range runs {
		top := float64(topH + i*(panelH+panelGp) + 16)
		bottom := top + panelH
		applied := r.events["applied"]
		conv, ok := r.converged()
		last := r.last()
		verdict := "did not converge"
		if ok {
			verdict = fmt.Sprintf("converged after %.2f s", conv)
		}
		p(`<text x="%d" y="%.1f" font-weight="bold" fill="#1d2430">%s</text>`, left, top-6, esc(r.label))
		p(`<text x="%d" y="%.1f" text-anchor="end" fill="#5d6778">%s; %d NACKs, %d rounds</text>`+"\n", width-right, top-6, esc(verdict), last.nacks, last.rounds)
		p(`<rect x="%d" y="%.1f" width="%d" height="%d" fill="#fbfcfd" stroke="#d9dde4"/>`+"\n", left, top, width-left-right, panelH)
		for kind, d := range r.outages {
			x0, x1 := x(-applied), x(math.Min(d.Seconds()-applied, xmax))
			if x1 > x0 {
				p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="#fdecea" fill-opacity="0.7"><title>%s refused for %s</title></rect>`+"\n", x0, top, x1-x0, panelH, esc(kind), d)
			}
		}
		for _, t := range ticks(xmin, xmax, step) {
			p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eceef2"/>`, x(t), x(t), top, bottom)
		}
		p("\n")
		ymax := math.Max(1, float64(max(last.nacks, last.rounds)))
		for _, s := range r.samples {
			ymax = math.Max(ymax, float64(max(s.nacks, s.rounds)))
		}
		y := func(v int) float64 { return bottom - float64(v)/ymax*(panelH-10) }
		p(`<text x="%d" y="%.1f" text-anchor="end" fill="#5d6778">%d</text>`, left-6, top+14, int(ymax))
		p(`<text x="%d" y="%.1f" text-anchor="end" fill="#5d6778">0</text>`+"\n", left-6, bottom)
		p(`%s`, stepLine(r.samples, applied, x, y, func(s sample) int { return s.nacks }, "#b42318", xmax))
		p(`%s`, stepLine(r.samples, applied, x, y, func(s sample) int { return s.rounds }, "#1f4e79", xmax))
		p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#5d6778" stroke-dasharray="4 3"/>`, x(0), x(0), top, bottom)
		p(`<text x="%.1f" y="%.1f" fill="#5d6778" font-size="11">apply</text>`+"\n", x(0)+3, bottom-4)
		if ok {
			p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#1f7a3d" stroke-width="2"/>`, x(conv), x(conv), top, bottom)
			anchor, dx := "start", 4.0
			if x(conv) > width-right-110 {
				anchor, dx = "end", -4
			}
			p(`<text x="%.1f" y="%.1f" text-anchor="%s" fill="#1f7a3d" font-size="11">converged %.2f s</text>`+"\n", x(conv)+dx, top+panelH*0.55, anchor, conv)
		}
		p(`<text x="%d" y="%.1f" fill="#b42318">NACKs %d</text>`, width-right+8, top+30, last.nacks)
		p(`<text x="%d" y="%.1f" fill="#1f4e79">rounds %d</text>`+"\n", width-right+8, top+48, last.rounds)
	}
	axisY := float64(topH + len(runs)*(panelH+panelGp) + 14)
	for _, t := range ticks(xmin, xmax, step) {
		p(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="#5d6778">%s s</text>`, x(t), axisY, strconv.FormatFloat(t, 'f', -1, 64))
	}
	p("\n</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// stepLine is a cumulative count as a step path, from its first sample to the axis's end.
func stepLine(samples []sample, applied float64, x func(float64) float64, y func(int) float64, v func(sample) int, color string, xmax float64) string {
	if len(samples) == 0 {
		return ""
	}
	d := &strings.Builder{}
	fmt.Fprintf(d, "M%.1f %.1f", x(samples[0].t-applied), y(0))
	for _, s := range samples {
		fmt.Fprintf(d, " H%.1f V%.1f", x(s.t-applied), y(v(s)))
	}
	fmt.Fprintf(d, " H%.1f", x(xmax))
	return fmt.Sprintf(`<path d="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", d, color)
}

// ticks are the multiples of step from xmin to xmax (0 exactly, never -0).
func ticks(xmin, xmax, step float64) []float64 {
	var out []float64
	for k := math.Ceil(xmin / step); k*step <= xmax; k++ {
		t := math.Round(k*step*1000) / 1000
		if t == 0 {
			t = 0
		}
		out = append(out, t)
	}
	return out
}

// tickStep picks a round step for about 8 ticks over span seconds.
func tickStep(span float64) float64 {
	for _, s := range []float64{0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300} {
		if span/s <= 10 {
			return s
		}
	}
	return 600
}
