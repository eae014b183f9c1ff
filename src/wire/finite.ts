/** Whether every value is finite: x - x is 0 for finite x and NaN for NaN or an infinity. */
export function allFinite(values: Float32Array): boolean {
  let acc = 0;
  for (let i = 0; i < values.length; i++) acc += values[i]! - values[i]!;
  return acc === 0;
}
