/**
 * The plain page of a job or a user script run by the launcher: a status line, a log, and the
 * result or the error reported to the launcher (the training job has its dashboard instead).
 */
import { report } from '../report.ts';
import { el } from '../ui/dom.ts';
import '../style.css';

export interface JobPage {
  /** A line of progress: on the page and in the console (which the launcher prefixes with the rank). */
  log(line: string): void;
  status(text: string): void;
}

/** Runs `body` under `title`, then reports what it returned, or the error it threw. */
export async function runOnPage(app: HTMLElement, title: string, body: (page: JobPage) => Promise<Record<string, unknown>>): Promise<void> {
  const logList = el('ol', { class: 'log', 'aria-label': 'log' });
  const status = el('p', { class: 'status', role: 'status' }, `${title}: starting…`);
  app.append(el('h1', {}, 'Browser DDP'), status, logList);
  const page: JobPage = {
    log: (line) => {
      console.log(line);
      logList.append(el('li', {}, line));
    },
    status: (text) => (status.textContent = `${title}: ${text}`),
  };
  try {
    const result = await body(page);
    page.status('done');
    report({ type: 'result', result });
  } catch (err) {
    const e = err instanceof Error ? err : new Error(String(err));
    status.textContent = `${title} failed: ${e.message}`;
    status.classList.add('error');
    console.error(`${e.name}: ${e.message}`);
    report({ type: 'error', name: e.name, message: e.message });
  }
}
