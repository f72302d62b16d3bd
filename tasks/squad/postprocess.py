"""SQuAD post-processing: logits -> n-best answers -> the original's three prediction files.

`compute_predictions` finds the n-best spans per question from start/end logits
(vectorised over all windows), the v2.0 null score, and the final text aligned back onto
the original context (`get_final_text`); `write_predictions` writes `predictions.json`,
`nbest_predictions.json` and (v2.0) `null_odds.json` in the original's formats, as one
all-or-nothing set. The results are the original's, bit for bit;
tests/test_squad_postprocess.py runs both.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
from typing import Sequence

import numpy as np
from absl import logging

from data_prep import fileio, tokenization
from tasks.squad.data import SquadExample, SquadFeature, check_answer_settings

# The original's initial "minimum null score": large and positive.
_NO_NULL_SCORE = 1000000

@dataclasses.dataclass(frozen=True)
class PostprocessConfig:
    """Settings of answer extraction (the original's flags of the same names)."""

    n_best_size: int = 20
    max_answer_length: int = 30
    do_lower_case: bool = True
    version_2_with_negative: bool = False
    null_score_diff_threshold: float = 0.0
    verbose_logging: bool = False

    def __post_init__(self):
        check_answer_settings(self.n_best_size, self.max_answer_length)


@dataclasses.dataclass
class SquadPredictions:
    """Post-processing output; each mapping is ordered like the examples."""

    predictions: "collections.OrderedDict[str, str]"
    nbest: "collections.OrderedDict[str, list]"
    null_odds: "collections.OrderedDict[str, float]"


def _nth_non_space(text: str, n: int) -> int:
    """Index in `text` of its n-th (0-based) character other than " "."""
    position = 0
    for part in text.split(" "):
        if n < len(part):
            return position + n
        n -= len(part)
        position += len(part) + 1
    raise IndexError(n)


def get_final_text(pred_text: str, orig_text: str, do_lower_case: bool,
                   verbose_logging: bool = False) -> str:
    """Maps de-tokenized `pred_text` back onto the original words `orig_text`.

    `orig_text` is the whole words the predicted sub-tokens came from ("Steve Smith's" for
    "steve smith"); the answer should keep the context's case, accents and punctuation
    ("Steve Smith"). `orig_text` is re-tokenized with BasicTokenizer; when it has as many
    non-space characters as the original, the two are aligned character by character and
    the span of `pred_text` is cut out of `orig_text`. Otherwise `orig_text` is returned.
    """
    tok_text = " ".join(tokenization.basic_tokenize(orig_text, do_lower_case))
    start = tok_text.find(pred_text)
    if start == -1:
        if verbose_logging:
            logging.info("Unable to find text: %r in %r", pred_text, orig_text)
        return orig_text
    end = start + len(pred_text) - 1

    # Character alignment: the i-th non-space character of tok_text is the i-th of
    # orig_text when both have as many.
    if len(orig_text) - orig_text.count(" ") != len(tok_text) - tok_text.count(" "):
        if verbose_logging:
            logging.info("Length not equal after stripping spaces: %r vs %r",
                         orig_text.replace(" ", ""), tok_text.replace(" ", ""))
        return orig_text
    # A span boundary on a space of tok_text (or outside it) has no aligned character.
    if not 0 <= start < len(tok_text) or tok_text[start] == " ":
        if verbose_logging:
            logging.info("Couldn't map start position")
        return orig_text
    if not 0 <= end < len(tok_text) or tok_text[end] == " ":
        if verbose_logging:
            logging.info("Couldn't map end position")
        return orig_text
    orig_start = _nth_non_space(orig_text, start - tok_text.count(" ", 0, start))
    orig_end = _nth_non_space(orig_text, end - tok_text.count(" ", 0, end))
    return orig_text[orig_start:orig_end + 1]


def _softmax(scores: Sequence[float]) -> list[float]:
    # Plain floats, summed in order: the probabilities are then identical to the original's.
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = 0.0
    for x in exps:
        total += x
    return [x / total for x in exps]


def _stack_results(results, features) -> tuple[np.ndarray, np.ndarray]:
    """[num_features, seq_len] float64 start/end logits in `features` order."""
    unique_ids, starts, ends = results
    row_of = {int(u): i for i, u in enumerate(np.asarray(unique_ids).reshape(-1))}
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    get = lambda i: (starts[i], ends[i])  # noqa: E731
    rows = []
    for f in features:
        if f.unique_id not in row_of:
            raise KeyError(
                f"no logits for feature unique_id {f.unique_id} "
                f"(example_index {f.example_index}, window {f.doc_span_index})"
            )
        rows.append(row_of[f.unique_id])
    pairs = [get(i) for i in rows]
    width = max((len(s) for s, _ in pairs), default=0)
    start = np.full((len(pairs), width), -np.inf)
    end = np.full((len(pairs), width), -np.inf)
    for k, (s, e) in enumerate(pairs):
        start[k, : len(s)] = np.asarray(s, dtype=np.float64)
        end[k, : len(e)] = np.asarray(e, dtype=np.float64)
    return start, end


def _position_masks(features, width):
    """Per feature: which positions are context tokens, and which are scored here (max context)."""
    in_doc = np.zeros((len(features), width + 1), dtype=bool)
    max_ctx = np.zeros((len(features), width + 1), dtype=bool)
    for k, f in enumerate(features):
        keys = np.fromiter(f.token_to_orig_map.keys(), np.int64, len(f.token_to_orig_map))
        in_doc[k, np.minimum(keys, width)] = True
        mc = f.token_is_max_context
        mc_keys = np.fromiter(mc.keys(), np.int64, len(mc))
        mc_vals = np.fromiter(mc.values(), bool, len(mc))
        max_ctx[k, np.minimum(mc_keys[mc_vals], width)] = True
    # Column `width` collects out-of-range keys; no logit index reaches it.
    return in_doc[:, :width], max_ctx[:, :width]


def _candidates(features, start, end, config):
    """All valid (feature, start, end) pairs among each window's top-n starts x top-n ends.

    Returns arrays (feature row, start index, end index, score) sorted by example, then by
    score descending; ties keep the original's enumeration order (window, start rank,
    end rank), which a stable sort preserves.
    """
    num, width = start.shape
    n = min(config.n_best_size, width)
    # Stable descending order by logit: ties go to the lower index, like sorted(reverse=True).
    top_s = np.argsort(-start, axis=1, kind="stable")[:, :n]
    top_e = np.argsort(-end, axis=1, kind="stable")[:, :n]
    in_doc, max_ctx = _position_masks(features, width)
    num_tokens = np.array([len(f.tokens) for f in features], dtype=np.int64)
    rows = np.arange(num)[:, None]
    s_ok = in_doc[rows, top_s] & max_ctx[rows, top_s] & (top_s < num_tokens[:, None])
    e_ok = in_doc[rows, top_e] & (top_e < num_tokens[:, None])
    s_idx = top_s[:, :, None]
    e_idx = top_e[:, None, :]
    length = e_idx - s_idx + 1
    valid = (s_ok[:, :, None] & e_ok[:, None, :]
             & (length >= 1) & (length <= config.max_answer_length))
    f_k, i_k, j_k = np.nonzero(valid)
    s_pos = top_s[f_k, i_k]
    e_pos = top_e[f_k, j_k]
    start_logit = start[f_k, s_pos]
    end_logit = end[f_k, e_pos]
    score = start_logit + end_logit
    example_of = np.array([f.example_index for f in features], dtype=np.int64)[f_k]
    order = np.lexsort((-score, example_of))
    return (example_of[order], f_k[order], s_pos[order], e_pos[order],
            start_logit[order], end_logit[order], score[order])


def compute_predictions(
    examples: Sequence[SquadExample],
    features: Sequence[SquadFeature],
    results,
    config: PostprocessConfig = PostprocessConfig(),
) -> SquadPredictions:
    """Answers from logits: the original's write_predictions, without the files.

    Args:
      examples: the prediction examples, in the order features were made from them.
      features: their windows (any order; each example's windows are used in list order).
      results: a tuple (unique_ids [N], start_logits [N, L], end_logits [N, L]) of arrays.
      config: n-best size, maximum answer length, casing and the v2.0 settings.

    Returns:
      SquadPredictions: predictions (qas_id -> text), nbest (qas_id -> list of
      {text, probability, start_logit, end_logit}) and, for v2.0, null_odds
      (qas_id -> null score minus the best non-null score).
    """
    features = list(features)
    start, end = _stack_results(results, features)
    ex_of, f_of, s_of, e_of, sl_of, el_of, sc_of = _candidates(features, start, end, config)
    bounds = np.searchsorted(ex_of, np.arange(len(examples) + 1))

    feature_rows = collections.defaultdict(list)
    for k, f in enumerate(features):
        feature_rows[f.example_index].append(k)

    v2 = config.version_2_with_negative
    text_cache: dict = {}  # overlapping windows often propose the same span
    predictions = collections.OrderedDict()
    all_nbest = collections.OrderedDict()
    null_odds = collections.OrderedDict()
    for example_index, example in enumerate(examples):
        null = _null_candidate(start, end, feature_rows.get(example_index, [])) if v2 else None
        spans = (
            (features[f_of[c]], int(s_of[c]), int(e_of[c]), float(sl_of[c]), float(el_of[c]))
            for c in range(bounds[example_index], bounds[example_index + 1])
        )
        nbest = _example_nbest(example, spans, null, config, text_cache)
        all_nbest[example.qas_id] = _nbest_json(nbest)
        if not v2:
            predictions[example.qas_id] = nbest[0][0]
            continue
        score_null = null[0] + null[1]
        best_non_null = next((x for x in nbest if x[0]), None)
        if best_non_null is None:
            # No span survived the filters (the original fails here): answer "".
            null_odds[example.qas_id] = float(_NO_NULL_SCORE)
            predictions[example.qas_id] = ""
            continue
        diff = score_null - best_non_null[1] - best_non_null[2]
        null_odds[example.qas_id] = diff
        predictions[example.qas_id] = (
            "" if diff > config.null_score_diff_threshold else best_non_null[0])
    return SquadPredictions(predictions, all_nbest, null_odds)


def _null_candidate(start, end, rows) -> tuple[float, float]:
    """(start logit, end logit) at [CLS] of the window with the lowest null score."""
    if not rows:
        return 0.0, 0.0
    null_scores = start[rows, 0] + end[rows, 0]
    best = int(np.argmin(null_scores))  # first window on ties, like the original
    if not null_scores[best] < _NO_NULL_SCORE:
        return 0.0, 0.0
    return float(start[rows[best], 0]), float(end[rows[best], 0])


def _example_nbest(example, spans, null, config, text_cache) -> list[tuple[str, float, float]]:
    """The n-best (text, start_logit, end_logit) of one question.

    `spans` yields (feature, start, end, start_logit, end_logit) best first; `null` is the
    v2.0 null candidate or None. Texts are deduplicated; the null candidate sorts after
    every span scoring at least as much, and is added at the end when not yet present.
    """
    nbest: list[tuple[str, float, float]] = []
    seen: set[str] = set()
    score_null = null[0] + null[1] if null is not None else None
    null_pending = null is not None
    for feature, s, e, start_logit, end_logit in spans:
        if len(nbest) >= config.n_best_size:
            break
        if null_pending and start_logit + end_logit < score_null:
            null_pending = False
            seen.add("")
            nbest.append(("", *null))
            if len(nbest) >= config.n_best_size:
                break
        text = _span_text(example, feature, s, e, config, text_cache)
        if text in seen:
            continue
        seen.add(text)
        nbest.append((text, start_logit, end_logit))
    if null_pending and len(nbest) < config.n_best_size:  # the null comes last in order
        seen.add("")
        nbest.append(("", *null))
    if null is not None and "" not in seen:
        nbest.append(("", *null))
    if not nbest:
        nbest.append(("empty", 0.0, 0.0))  # the original's placeholder
    return nbest


def _nbest_json(nbest) -> list:
    probs = _softmax([s + e for _, s, e in nbest])
    entries = []
    for (text, start_logit, end_logit), p in zip(nbest, probs):
        entry = collections.OrderedDict()
        entry["text"] = text
        entry["probability"] = p
        entry["start_logit"] = start_logit
        entry["end_logit"] = end_logit
        entries.append(entry)
    return entries


def _span_text(example, feature, start_index, end_index, config, cache) -> str:
    """The answer text of sub-tokens [start_index, end_index] of a window."""
    tok_text = " ".join(feature.tokens[start_index:end_index + 1])
    tok_text = tok_text.replace(" ##", "").replace("##", "")
    tok_text = " ".join(tok_text.strip().split())
    orig_start = feature.token_to_orig_map[start_index]
    orig_end = feature.token_to_orig_map[end_index]
    key = (id(example.doc_tokens), orig_start, orig_end, tok_text)
    text = cache.get(key)
    if text is None:
        orig_text = " ".join(example.doc_tokens[orig_start:orig_end + 1])
        text = get_final_text(tok_text, orig_text, config.do_lower_case, config.verbose_logging)
        cache[key] = text
    return text


def predictions_to_json(predictions: SquadPredictions) -> dict[str, str]:
    """File name -> contents, formatted exactly as the original writes them."""
    files = {
        "predictions.json": json.dumps(predictions.predictions, indent=4) + "\n",
        "nbest_predictions.json": json.dumps(predictions.nbest, indent=4) + "\n",
    }
    if predictions.null_odds:
        files["null_odds.json"] = json.dumps(predictions.null_odds, indent=4) + "\n"
    return files


def write_predictions(
    examples: Sequence[SquadExample],
    features: Sequence[SquadFeature],
    results,
    config: PostprocessConfig,
    output_dir: str,
) -> tuple[SquadPredictions, dict[str, str]]:
    """Computes predictions and writes predictions.json, nbest_predictions.json and (v2.0)
    null_odds.json into `output_dir` as one all-or-nothing set. Returns (predictions,
    name -> path)."""
    result = compute_predictions(examples, features, results, config)
    texts = predictions_to_json(result)
    if not config.version_2_with_negative:
        texts.pop("null_odds.json", None)
    paths = {name: os.path.join(output_dir, name) for name in texts}
    fileio.write_texts({paths[name]: text for name, text in texts.items()})
    for path in paths.values():
        logging.info("Wrote %s", path)
    return result, paths
