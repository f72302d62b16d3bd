"""predict_saved_model.py: serve raw strings with an exported SavedModel, from the shell.

    python predict_saved_model.py --export_dir=export/classifier \
        --text="Return the number of items." --text="Hello"
    python predict_saved_model.py --export_dir=export/mrpc \
        --text="The cat sat." --text_pair="A cat sat down."
    python predict_saved_model.py --export_dir=export/squad \
        --question="Who sat?" --context="The cat sat on the mat."
    python predict_saved_model.py --export_dir=export/ner \
        --text="Angela Merkel met Emmanuel Macron in Paris."
    python predict_saved_model.py --export_dir=export/swag \
        --context="Someone opens the door." --question="He" \
        --ending="walks in." --ending="eats the door." --ending="is a door." --ending="sings."

It imports only `tensorflow` and `tensorflow_text` (no code of this repository), so it is
also a check that an export (`export_saved_model.py`, docs/export.md) serves on its own:
`tf.saved_model.load`, then the `serving_default` signature (or `--signature`) on the
given strings. It prints one line per input: for a classifier the predicted label, its
probability and every label's probability; for a tagger the entities and each word's
tag; otherwise each output's value (vectors summarised by their shape). Outputs
flattened over the batch with a ``<prefix>example_index`` (a tagger's entities and
words, SQuAD's windows) are gathered per input. `--output_json=FILE` also writes
`{"export_dir", "signature", "inputs", "predictions": [{output: value, ...}, ...]}`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _parse(argv):
    parser = argparse.ArgumentParser(
        prog="python predict_saved_model.py",
        description="Print the predictions of an exported SavedModel on raw strings.")
    parser.add_argument("--export_dir", required=True, help="the SavedModel's folder")
    parser.add_argument("--text", action="append", default=[],
                        help="an input text (repeat the flag for a batch)")
    parser.add_argument("--text_pair", action="append", default=[],
                        help="pair tasks: the second text of each --text, in order")
    parser.add_argument("--question", action="append", default=[],
                        help="SQuAD: a question; multiple choice: the start of the endings")
    parser.add_argument("--context", action="append", default=[],
                        help="SQuAD: the context of each --question, in order")
    parser.add_argument("--ending", action="append", default=[],
                        help="multiple choice: an ending; the endings of all --context "
                        "values in order, the same number for each (--question optional)")
    parser.add_argument("--signature", default="serving_default",
                        help="signature to call (default: serving_default)")
    parser.add_argument("--output_json", default="",
                        help="also write the inputs and outputs to this JSON file")
    return parser, parser.parse_args(argv)


def _inputs(parser, args) -> dict:
    given = {name: getattr(args, name) for name in ("text", "text_pair", "question", "context")
             if getattr(args, name)}
    if not given:
        parser.error("give at least one --text (or --question and --context)")
    if args.ending:
        contexts = given.get("context", [])
        if not contexts or len(args.ending) % len(contexts):
            parser.error(f"--ending x{len(args.ending)} must be a multiple of --context "
                         f"x{len(contexts)}: each context gets the same number of endings")
        per = len(args.ending) // len(contexts)
        given.setdefault("question", [""] * len(contexts))
        given["endings"] = [args.ending[i:i + per] for i in range(0, len(args.ending), per)]
    sizes = {len(values) for values in given.values()}
    if len(sizes) != 1:
        parser.error("--text/--text_pair (or --question/--context) must be repeated the "
                     "same number of times: " + ", ".join(
                         f"{name} x{len(values)}" for name, values in given.items()))
    return given


def _to_python(value):
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [_to_python(v) for v in value]
    return value


def _labels(export_dir: str) -> list:
    """Label names in id order, from assets.extra/export_metadata.json when present."""
    path = os.path.join(export_dir, "assets.extra", "export_metadata.json")
    try:
        with open(path, encoding="utf-8") as reader:
            labels = json.load(reader).get("labels") or []
    except (OSError, ValueError):
        return []
    return [str(label) for label in labels]


def _rows(outputs: dict, count: int) -> list:
    """Per input: the outputs whose leading dimension is the batch, and the outputs
    flattened over the batch with a ``<prefix>example_index`` beside them (a tagger's
    ``entity_*`` and ``word_*``, SQuAD's ``window_*``) gathered into lists by it."""
    rows = [{} for _ in range(count)]
    prefixes = [key[:-len("example_index")] for key in outputs
                if key.endswith("example_index")]
    for key, value in outputs.items():
        prefix = next((p for p in prefixes if key.startswith(p)), None)
        if prefix is not None:
            index = outputs[prefix + "example_index"]
            if key != prefix + "example_index":
                for i, row in enumerate(rows):
                    row[key] = [v for e, v in zip(index, value, strict=True) if e == i]
        elif isinstance(value, list) and len(value) == count:
            for i, row in enumerate(rows):
                row[key] = value[i]
    return rows


def _describe(row: dict, labels: list) -> str:
    if "entity_type" in row and "word_tag" in row:
        entities = ", ".join(f"{text!r} {kind} [{start}:{end}]" for text, kind, start, end in
                             zip(row["entity_text"], row["entity_type"], row["entity_start"],
                                 row["entity_end"], strict=True))
        tags = " ".join(f"{word}/{tag}" for word, tag in zip(row["word_text"], row["word_tag"],
                                                            strict=True))
        return f"entities: {entities or 'none'}; tags: {tags}"
    if "probabilities" in row and "label" in row:
        probabilities = row["probabilities"]
        names = labels if len(labels) == len(probabilities) else [
            str(i) for i in range(len(probabilities))]
        best = max(range(len(probabilities)), key=lambda i: probabilities[i])
        spread = ", ".join(f"{n} {p:.3f}" for n, p in zip(names, probabilities, strict=True))
        return f"{row['label']} (p={probabilities[best]:.3f}; {spread})"
    if "answer_text" in row:
        return f"{row['answer_text']!r} (score {row.get('score', float('nan')):.3f})"
    parts = []
    for key, value in sorted(row.items()):
        if isinstance(value, list):
            shape, probe = [], value
            while isinstance(probe, list):
                shape.append(len(probe))
                probe = probe[0] if probe else None
            parts.append(f"{key} {'x'.join(map(str, shape))}")
        else:
            parts.append(f"{key}={value}")
    return ", ".join(parts)


def main(argv=None) -> int:
    parser, args = _parse(argv)
    inputs = _inputs(parser, args)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  -- registers the ops the graph uses

    try:
        model = tf.saved_model.load(args.export_dir)
    except (OSError, ValueError) as err:
        print(f"predict_saved_model.py: error: cannot load {args.export_dir}: {err}",
              file=sys.stderr)
        return 2
    if args.signature not in model.signatures:
        print(f"predict_saved_model.py: error: no signature {args.signature!r} in "
              f"{args.export_dir} (it has: {', '.join(sorted(model.signatures))})",
              file=sys.stderr)
        return 2
    function = model.signatures[args.signature]
    expected = set(function.structured_input_signature[1])
    if set(inputs) != expected:
        print(f"predict_saved_model.py: error: signature {args.signature!r} takes "
              f"{sorted(expected)}, got {sorted(inputs)}", file=sys.stderr)
        return 2
    outputs = function(**{name: tf.constant(values, tf.string)
                          for name, values in inputs.items()})
    outputs = {key: _to_python(value.numpy()) for key, value in outputs.items()}
    count = len(next(iter(inputs.values())))
    rows = _rows(outputs, count)
    labels = _labels(args.export_dir)
    for i, row in enumerate(rows):
        shown = " | ".join(repr(values[i]) for values in inputs.values())
        print(f"{shown} -> {_describe(row, labels)}")
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as writer:
            json.dump({"export_dir": args.export_dir, "signature": args.signature,
                       "inputs": inputs, "labels": labels, "predictions": rows}, writer,
                      indent=2, ensure_ascii=False)
            writer.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
