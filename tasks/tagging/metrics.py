"""Owns the tagging metrics: the CoNLL shared tasks' `conlleval` script, ported, and chunk decoding.

`conlleval` (CoNLL-2000, version 2004-01-26, Erik Tjong Kim Sang) reads lines of
`word ... gold predicted`, blank lines (or `-X-` lines) between sentences, and reports
token accuracy and chunk precision, recall and F1, overall (micro-averaged) and per chunk
type. Its rules, reproduced here:

* A tag `P-TYPE` splits at its FIRST hyphen into a prefix and a type (`B-ORG-X` is type
  `ORG-X`); a tag without a hyphen (`O`) has the empty type. The perl treats a type
  spelled `0` as empty (its truth test); so do we.
* A chunk starts and ends where `start_of_chunk` / `end_of_chunk` say, from the previous
  and the current tag of the same column: the perl's rules, which cover IOB1 and IOB2
  (prefixes O, B, I) and IOE1/IOE2 (O, I, E). The perl does not know the IOBES prefix `S`
  and never ends a chunk at `E-X B-X` (it would merge `S-PER S-PER`, two people, into one
  chunk); for those cases alone we add the rules of `seqeval`'s default mode (`S` starts
  and ends a chunk, `B` after `E` starts a new one). So the counts equal the perl's on
  every input without `S-` tags and without an `E-` tag followed by a `B-` tag, and
  seqeval's default mode on every IOB1, IOB2 and IOBES input.
* A sentence boundary is a token `O O` that is not counted: every chunk ends there.
* A predicted chunk is correct only if a gold chunk starts at the same token, with the
  same type, and both end at the same token (the perl's `inCorrect` state machine).
* precision = correct / predicted chunks, recall = correct / gold chunks,
  F1 = 2PR / (P + R), each 0 when its denominator is 0; per type the same over the
  chunks of that type; accuracy = tokens whose gold and predicted tags are equal / tokens.

`evaluate(sentences)` counts; `ChunkCounts.figures()` gives the fractions (the perl
prints percentages); `report(counts)` prints the perl's text; `chunks(tags)` decodes the
(type, start, end) chunks of one tag sequence with the same rules (what a served tagger
returns as entities). The command is `tasks.tagging.conlleval`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from data_prep.cli import UserError

# conlleval's sentence-boundary word and outside tag.
BOUNDARY = "-X-"
OUTSIDE = "O"


def split_tag(tag: str) -> tuple[str, str]:
    """(prefix, type) of a tag as conlleval splits it: at the first hyphen.

    "B-PER" -> ("B", "PER"), "I-ORG-X" -> ("I", "ORG-X"), "O" -> ("O", "").
    """
    prefix, hyphen, kind = tag.partition("-")
    if not hyphen:
        return tag, ""
    # The perl: `$type = $type ? $type : ""`, so a type "0" counts as empty.
    return prefix, "" if kind == "0" else kind


def end_of_chunk(prev_tag: str, tag: str, prev_type: str, kind: str) -> bool:
    """Whether a chunk ended between the previous token and this one (prefixes and types)."""
    # conlleval's rules, as the perl lists them.
    if (prev_tag, tag) in (("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"),
                           ("E", "E"), ("E", "I"), ("E", "O")):
        return True
    if prev_tag not in (OUTSIDE, ".") and prev_type != kind:
        return True
    if prev_tag in ("]", "["):  # conlleval 1998-12-22: these chunks have length 1
        return True
    # IOBES, as seqeval's default mode extends the rules: S ends its chunk, S and B end
    # the chunk before them.
    return prev_tag == "S" or (tag == "S" and prev_tag in ("B", "I", "E")) or (
        prev_tag == "E" and tag == "B")


def start_of_chunk(prev_tag: str, tag: str, prev_type: str, kind: str) -> bool:
    """Whether a chunk starts at this token (prefixes and types of it and the previous)."""
    # conlleval's rules, as the perl lists them.
    if (prev_tag, tag) in (("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"),
                           ("E", "E"), ("E", "I"), ("O", "E")):
        return True
    if tag not in (OUTSIDE, ".") and prev_type != kind:
        return True
    if tag in ("[", "]"):
        return True
    # IOBES (seqeval's default-mode extension): S starts a chunk, and so does B after E or
    # S, and I or E after S.
    return tag == "S" or (tag == "B" and prev_tag in ("E", "S")) or (
        prev_tag == "S" and tag in ("I", "E"))


@dataclasses.dataclass
class ChunkCounts:
    """What conlleval counts: chunks (overall and per type) and tokens."""

    correct_chunks: int = 0
    gold_chunks: int = 0
    predicted_chunks: int = 0
    correct_tokens: int = 0
    tokens: int = 0
    correct_by_type: dict = dataclasses.field(default_factory=dict)
    gold_by_type: dict = dataclasses.field(default_factory=dict)
    predicted_by_type: dict = dataclasses.field(default_factory=dict)

    def types(self) -> list[str]:
        """Chunk types seen in gold or predictions, sorted as the perl sorts them."""
        return sorted(set(self.gold_by_type) | set(self.predicted_by_type))

    def figures(self, types: Iterable[str] = ()) -> dict:
        """Fractions in [0, 1]: {"precision", "recall", "f1", "accuracy"} overall and
        "precision_T", "recall_T", "f1_T" per type T (the types seen, plus `types`; the
        empty type of untyped tags is left out)."""
        out = dict(zip(("precision", "recall", "f1"),
                       _prf(self.correct_chunks, self.predicted_chunks, self.gold_chunks)))
        out["accuracy"] = self.correct_tokens / self.tokens if self.tokens else 0.0
        for kind in sorted(set(self.types()) | set(types)):
            if not kind:
                continue
            p, r, f = _prf(self.correct_by_type.get(kind, 0),
                           self.predicted_by_type.get(kind, 0), self.gold_by_type.get(kind, 0))
            out[f"precision_{kind}"], out[f"recall_{kind}"], out[f"f1_{kind}"] = p, r, f
        return out


def _prf(correct: int, predicted: int, gold: int) -> tuple[float, float, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def _percent_prf(correct: int, predicted: int, gold: int) -> tuple[float, float, float]:
    """`_prf` in percent, computed in the perl's order (the printed digits match)."""
    precision = 100 * correct / predicted if predicted else 0.0
    recall = 100 * correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def _bump(table: dict, key: str) -> None:
    table[key] = table.get(key, 0) + 1


class _Counter:
    """The perl's main loop: one call of `token` per input line."""

    def __init__(self):
        self.counts = ChunkCounts()
        self.in_correct = False
        self.last_gold, self.last_gold_type = OUTSIDE, ""
        self.last_pred, self.last_pred_type = OUTSIDE, ""

    def token(self, gold_tag: str, pred_tag: str, boundary: bool = False) -> None:
        c = self.counts
        gold, gold_type = split_tag(gold_tag)
        pred, pred_type = split_tag(pred_tag)
        if boundary:  # "sentence breaks should always be counted as out of chunk"
            pred = OUTSIDE
        gold_end = end_of_chunk(self.last_gold, gold, self.last_gold_type, gold_type)
        pred_end = end_of_chunk(self.last_pred, pred, self.last_pred_type, pred_type)
        if self.in_correct:
            if gold_end and pred_end and self.last_pred_type == self.last_gold_type:
                self.in_correct = False
                c.correct_chunks += 1
                _bump(c.correct_by_type, self.last_gold_type)
            elif gold_end != pred_end or pred_type != gold_type:
                self.in_correct = False
        gold_start = start_of_chunk(self.last_gold, gold, self.last_gold_type, gold_type)
        pred_start = start_of_chunk(self.last_pred, pred, self.last_pred_type, pred_type)
        if gold_start and pred_start and pred_type == gold_type:
            self.in_correct = True
        if gold_start:
            c.gold_chunks += 1
            _bump(c.gold_by_type, gold_type)
        if pred_start:
            c.predicted_chunks += 1
            _bump(c.predicted_by_type, pred_type)
        if not boundary:
            if gold == pred and gold_type == pred_type:
                c.correct_tokens += 1
            c.tokens += 1
        self.last_gold, self.last_gold_type = gold, gold_type
        self.last_pred, self.last_pred_type = pred, pred_type

    def finish(self) -> ChunkCounts:
        if self.in_correct:
            self.in_correct = False
            self.counts.correct_chunks += 1
            _bump(self.counts.correct_by_type, self.last_gold_type)
        return self.counts


def evaluate(sentences: Iterable[Sequence[tuple[str, str]]]) -> ChunkCounts:
    """conlleval's counts for sentences of (gold tag, predicted tag) pairs.

    A boundary follows every sentence (as a blank line does in the perl's input), so
    chunks never cross sentences. A document break written as `-DOCSTART- O O` is a
    one-token sentence [("O", "O")]: the perl counts it as a token.
    """
    counter = _Counter()
    for sentence in sentences:
        for gold, pred in sentence:
            counter.token(gold, pred)
        counter.token(OUTSIDE, OUTSIDE, boundary=True)
    return counter.finish()


def evaluate_lines(lines: Iterable[str], delimiter: str = " ") -> ChunkCounts:
    """conlleval's counts for lines in its input format (`word ... gold predicted`).

    An empty line or one whose first field is `-X-` is a sentence boundary; fields are
    split on `delimiter` (the perl's default: one space). Lines with a different number of
    fields than the first raise UserError naming the line (the perl exits).
    """
    counter = _Counter()
    num_fields = None
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\n")
        fields = line.split(delimiter) if line else []
        # perl's split drops trailing empty fields
        while fields and fields[-1] == "":
            fields.pop()
        if num_fields is None:
            num_fields = len(fields) or None
        elif fields and len(fields) != num_fields:
            raise UserError(f"line {number}: unexpected number of features: {len(fields)} "
                            f"({num_fields})")
        if not fields or fields[0] == BOUNDARY:
            counter.token(OUTSIDE, OUTSIDE, boundary=True)
            continue
        if len(fields) < 2:
            raise UserError(f"line {number}: unexpected number of features in line {line!r}")
        counter.token(fields[-2], fields[-1])
    return counter.finish()


def report(counts: ChunkCounts) -> str:
    """The perl's text report (percentages with two decimals)."""
    c = counts
    lines = [(f"processed {c.tokens} tokens with {c.gold_chunks} phrases; "
              f"found: {c.predicted_chunks} phrases; correct: {c.correct_chunks}.")]
    if c.tokens:
        p, r, f = _percent_prf(c.correct_chunks, c.predicted_chunks, c.gold_chunks)
        lines.append(f"accuracy: {100 * c.correct_tokens / c.tokens:6.2f}%; "
                     f"precision: {p:6.2f}%; recall: {r:6.2f}%; FB1: {f:6.2f}")
    types = c.types()
    if "" in c.gold_by_type and "" in c.predicted_by_type:
        types.insert(0, "")  # the perl lists the empty type twice (`not($lastType)` is true)
    for kind in types:
        p, r, f = _percent_prf(c.correct_by_type.get(kind, 0),
                               c.predicted_by_type.get(kind, 0), c.gold_by_type.get(kind, 0))
        lines.append(f"{kind:>17s}: precision: {p:6.2f}%; recall: {r:6.2f}%; FB1: {f:6.2f}  "
                     f"{c.predicted_by_type.get(kind, 0)}")
    return "\n".join(lines) + "\n"


def chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The chunks of one tag sequence as (type, first token, last token), by the rules above.

    Chunks of the empty type (tags without a hyphen other than O) are included with type "".
    """
    out = []
    start = None
    prev, prev_type = OUTSIDE, ""
    for i, tag in enumerate(list(tags) + [OUTSIDE]):  # a final O ends the last chunk
        prefix, kind = split_tag(tag)
        if start is not None and end_of_chunk(prev, prefix, prev_type, kind):
            out.append((prev_type, start, i - 1))
            start = None
        if start_of_chunk(prev, prefix, prev_type, kind):
            start = i
        prev, prev_type = prefix, kind
    return out
