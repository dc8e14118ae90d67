// A time chart (uPlot) of one or more numeric series; x is milliseconds.
import { useEffect, useRef } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';

const COLORS = ['#1f6feb', '#d1242f', '#1a7f37', '#9a6700', '#8250df', '#0a7ea4'];

export interface Line { key: string; points: [number, number][] }

/** Aligns the series on their timestamps (ascending), as uPlot wants them. */
function aligned(lines: Line[]): uPlot.AlignedData {
  const xs = [...new Set(lines.flatMap((l) => l.points.map((p) => p[0])))].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = lines.map((l) => {
    const y: (number | null)[] = new Array(xs.length).fill(null);
    for (const [x, v] of l.points) y[index.get(x)!] = v;
    return y;
  });
  return [xs.map((x) => x / 1000), ...ys];
}

export function Chart({ lines, label }: { lines: Line[]; label: string }) {
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const keys = lines.map((l) => l.key).join('\u0000');
  useEffect(() => {
    if (!host.current) return;
    const el = host.current;
    const opts: uPlot.Options = {
      width: Math.max(200, el.clientWidth),
      height: 260,
      series: [{}, ...lines.map((l, i) => ({ label: l.key, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true }))],
      axes: [{}, {}],
    };
    plot.current = new uPlot(opts, aligned(lines), el);
    // Follows its box's width (a phone turned, a window resized).
    const resized = new ResizeObserver(() => plot.current?.setSize({ width: Math.max(200, el.clientWidth), height: 260 }));
    resized.observe(el);
    return () => { resized.disconnect(); plot.current?.destroy(); plot.current = null; };
  }, [keys]);
  useEffect(() => { plot.current?.setData(aligned(lines)); }, [lines]);
  return <figure class="chart"><div ref={host} role="img" aria-label={label} data-points={lines.reduce((n, l) => n + l.points.length, 0)} /></figure>;
}
