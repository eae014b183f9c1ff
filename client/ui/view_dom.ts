/**
 * Helpers the dashboard's views (view_*.ts) share. Each view builds its elements once and then draws
 * a DashboardState, touching the DOM only when what it shows changed; its texts and figures come from
 * dashboard_state.ts and its panel's model module (dashboard_*.ts).
 */

/**
 * True when any input differs (by identity) from the previous call's: the state keeps the
 * identity of parts that did not change, so this is how a view skips redrawing.
 */
export function changeDetector(): (inputs: readonly unknown[]) => boolean {
  let last: readonly unknown[] | null = null;
  return (inputs) => {
    const changed = last === null || inputs.some((v, i) => v !== last![i]);
    last = inputs;
    return changed;
  };
}

export function setText(node: Node, text: string): void {
  if (node.textContent !== text) node.textContent = text;
}
