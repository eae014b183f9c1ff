/**
 * The page a bad link opens: what is wrong with it (the parameter, its value, what is allowed)
 * and what to do, instead of a blank page or a dashboard that says "failed".
 */
import { el } from './dom.ts';
import type { LinkProblem } from './link_check.ts';
import './styles/base.css';
import './styles/base_media.css';
import './styles/bad_link.css';

export function mountBadLink(root: HTMLElement, problem: LinkProblem): void {
  // Only the problem and what to do: a token problem offers no session of the person's own.
  const create =
    problem.offerCreate === false
      ? []
      : [el('p', { class: 'form-actions' }, el('a', { href: '/', class: 'btn btn-primary' }, 'Create a new session'))];
  root.append(
    el(
      'div',
      { class: 'ddp-ui bad-link-page' },
      el(
        'section',
        {
          class: 'card bad-link',
          role: 'alert',
          'aria-labelledby': 'bad-link-title',
          'data-testid': 'bad-link',
          'data-field': problem.field,
        },
        el('h1', { id: 'bad-link-title' }, problem.title),
        el('p', { class: 'bad-link-message', 'data-testid': 'bad-link-message' }, problem.message),
        el('p', { class: 'bad-link-action' }, el('strong', {}, 'What to do: '), problem.action),
        ...create,
      ),
    ),
  );
}
