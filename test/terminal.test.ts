/** What reaches the launcher's terminal from pages and peers: no control characters. */
import { describe, expect, it } from 'vitest';
import { printable } from '../launcher/run.ts';

describe('printable', () => {
  it('shows escape sequences and line breaks as \\xNN, keeps tabs and text', () => {
    expect(printable('lost rank 2: \u001b]0;pwned\u0007\u001b[2J')).toBe('lost rank 2: \\x1b]0;pwned\\x07\\x1b[2J');
    expect(printable('one\n[rank 0] forged line\r')).toBe('one\\x0a[rank 0] forged line\\x0d');
    expect(printable('a\tb é 🙂')).toBe('a\tb é 🙂');
    expect(printable('\u009b31m')).toBe('\\x9b31m');
  });
});
