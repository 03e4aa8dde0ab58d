// One stable, distinct colour per stream id (golden-angle hues), shared by grid and legend.

export function streamColor(streamId) {
  const hue = (Number(streamId) * 137.508 + 200) % 360;
  return `hsl(${hue.toFixed(1)}, 70%, 52%)`;
}
