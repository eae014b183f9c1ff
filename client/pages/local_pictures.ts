/**
 * The training page's first part in a session on each tab's own pictures (dataset local): the
 * capture panel above the dashboard, until the person joins with the pictures the tab holds (or
 * none). Nothing is sent before that: the tab is not even connected to the server yet.
 */
import type { LocalDataset } from '../../src/datasets/local.ts';
import type { LocalDataConfig } from '../../src/jobs/train_config.ts';
import { CapturePanel } from '../ui/capture_panel.ts';
import type { Dashboard } from '../ui/dashboard.ts';

/** Shows the capture panel and resolves with the tab's pictures as its LocalDataset once the person joins; the panel stays, fixed. */
export async function capturePictures(root: HTMLElement, local: LocalDataConfig, session: string, dash: Dashboard): Promise<LocalDataset> {
  const panel = new CapturePanel(local, session);
  root.prepend(panel.node);
  dash.setVisible(false);
  document.title = `pictures · ${session} · Browser DDP`;
  await panel.joined();
  panel.lock();
  dash.setVisible(true);
  return panel.pictures.toDataset(`${session} (this tab)`);
}
