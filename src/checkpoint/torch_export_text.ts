/**
 * The language model's vocabulary in its PyTorch export: without it the ids a torch model reads
 * and writes cannot be turned into characters. The vocabulary comes from a checkpoint's meta or
 * the page's tokenizer, so it is untrusted: it is checked (one character per id, distinct, as many
 * as the model's embedding has rows) and goes into the Python file only as `pythonString`
 * literals, data, never code. With it the file gets `encode`, `decode` and `generate`.
 */

/** Why `vocabulary` cannot be the vocabulary of a model with `vocabSize` token ids; undefined when it can. */
export function vocabularyProblem(vocabulary: unknown, vocabSize: number | undefined): string | undefined {
  if (vocabSize === undefined)
    return 'the model does not start with a token embedding, so it has no vocabulary to write (only a language model takes one)';
  if (!Array.isArray(vocabulary)) return `the vocabulary must be a list of characters, not ${typeof vocabulary}`;
  if (vocabulary.length !== vocabSize)
    return `the vocabulary has ${vocabulary.length} characters; the model's embedding has ${vocabSize} token ids`;
  const seen = new Set<string>();
  for (let i = 0; i < vocabulary.length; i++) {
    const c: unknown = vocabulary[i];
    if (typeof c !== 'string' || Array.from(c).length !== 1)
      return `vocabulary entry ${i} must be one character, got ${String(JSON.stringify(c)).slice(0, 40)}`;
    if (seen.has(c)) return `vocabulary entry ${i} (${JSON.stringify(c)}) repeats an earlier one: each character has one id`;
    seen.add(c);
  }
  return undefined;
}

/**
 * The Python that turns text into ids and back, and samples from the model as the tab does (the
 * last `context` ids, the last position's logits at a temperature). `literals` are the
 * vocabulary's characters, each already a `pythonString` literal.
 */
export function pythonTextHelpers(literals: string[]): string {
  const rows: string[] = [];
  for (let i = 0; i < literals.length; i += 12) rows.push(`    ${literals.slice(i, i + 12).join(', ')},`);
  return `

# The tokenizer the tabs trained with: token id i is VOCABULARY[i] (one character).
VOCABULARY = [
${rows.join('\n')}
]
_IDS = {c: i for i, c in enumerate(VOCABULARY)}


def encode(text):
    """Token ids of text, int64 [len(text)]; a character outside the vocabulary raises ValueError."""
    ids = []
    for i, c in enumerate(text):
        if c not in _IDS:
            raise ValueError("character %r at %d is not in the model's vocabulary of %d" % (c, i, len(VOCABULARY)))
        ids.append(_IDS[c])
    return torch.tensor(ids, dtype=torch.int64)


def decode(ids):
    """The text of token ids (a list or a tensor)."""
    return "".join(VOCABULARY[int(i)] for i in ids)


@torch.no_grad()
def generate(model, prompt, n, temperature=0.8, generator=None):
    """prompt followed by n characters the model writes, one at a time from its last position's
    logits at temperature (0: the most likely character), seeing at most its context."""
    if len(prompt) == 0:
        raise ValueError("generate needs a prompt of at least one character")
    ids = encode(prompt).tolist()
    context = Model.input_shape[0]
    for _ in range(n):
        logits = model(torch.tensor([ids[-context:]], dtype=torch.int64))[0, -1]
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            ids.append(int(torch.multinomial(probs, 1, generator=generator)))
        else:
            ids.append(int(logits.argmax()))
    return decode(ids)
`;
}
