"""predict_saved_model.py: serve raw strings with an exported SavedModel, from the shell.

    python predict_saved_model.py --export_dir=export/classifier \
        --text="Return the number of items." --text="Hello"
    python predict_saved_model.py --export_dir=export/mrpc \
        --text="The cat sat." --text_pair="A cat sat down."
    python predict_saved_model.py --export_dir=export/squad \
        --question="Who sat?" --context="The cat sat on the mat."
    python predict_saved_model.py --export_dir=export/ner \
        --text="Angela Merkel met Emmanuel Macron in Paris."
    python predict_saved_model.py --export_dir=export/minilm \
        --text="A man is eating food." --text="Someone eats." --output_json=vectors.json
    python predict_saved_model.py --export_dir=export/swag \
        --context="Someone opens the door." --question="He" \
        --ending="walks in." --ending="eats the door." --ending="is a door." --ending="sings."
    python predict_saved_model.py --export_dir=export/classifier --input_file=docs.txt
    python predict_saved_model.py --export_dir=export/squad --input_file=- < qa.jsonl

`--input_file` (`-`: stdin) takes the inputs from a file instead, for inputs too long or
too many for a command line: one text per line for a model of single texts; for pairs,
SQuAD and multiple choice one JSON object per line, keyed by the input flags' names
(`{"text": ..., "text_pair": ...}`, `{"question": ..., "context": ...}`,
`{"context": ..., "question": ..., "ending": [...]}`). Blank lines are skipped.

It imports only `tensorflow` and `tensorflow_text` (no code of this repository), so it is
also a check that an export (`export_saved_model.py`, docs/export.md) serves on its own:
`tf.saved_model.load`, then the `serving_default` signature (or `--signature`) on the
given strings. It prints one line per input: for a classifier the predicted label, its
probability and every label's probability; for a tagger the entities and each word's
tag; for an embedding its size, L2 norm and first values; otherwise each output's value
(vectors summarised by their shape). Outputs
flattened over the batch with a ``<prefix>example_index`` (a tagger's entities and
words, SQuAD's windows) are gathered per input. `--output_json=FILE` also writes
`{"export_dir", "signature", "inputs", "predictions": [{output: value, ...}, ...]}`,
all-or-nothing (a temporary beside it, renamed into place; local or tf.io.gfile paths).

Errors exit with status 1 and one line `predict_saved_model.py: error: <message>` naming the
argument, as every command of the repository (this one imports none of it: the same
convention, kept here so serving needs nothing but TensorFlow): an input string that is not
valid UTF-8 (bytes the shell passed that are not UTF-8, or a lone surrogate), an input
the export refuses (e.g. a context needing more windows than the export's
max_context_windows: the message names the input), an --output_json that is a directory
or cannot be written, or that is the --input_file or a file inside --export_dir (writing
it would destroy the inputs or the export; checked before any work), an --input_file line
that is not what the model takes (file and line named). Ctrl-C ends it with one line and status 130, SIGTERM with status 143, as
every command (the --output_json temporary removed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import traceback

# Input flags in the order their values are reported.
INPUT_FLAGS = ("text", "text_pair", "question", "context", "ending")


class UsageError(ValueError):
    """An argument that cannot work; the message names it (exit status 1)."""


class _ArgumentParser(argparse.ArgumentParser):
    """A bad argument is one error line and status 1 (not argparse's usage and 2)."""

    def error(self, message):
        sys.exit(_error(message))


def _parse(argv):
    parser = _ArgumentParser(
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
    parser.add_argument("--input_file", default="",
                        help="the inputs, one per line, instead of the input flags: a text "
                        "per line for a model of single texts, else a JSON object per line "
                        "keyed by the input flags' names; - reads stdin")
    parser.add_argument("--signature", default="serving_default",
                        help="signature to call (default: serving_default)")
    parser.add_argument("--output_json", default="",
                        help="also write the inputs and outputs to this JSON file")
    return parser, parser.parse_args(argv)


def _check_utf8(args) -> None:
    """Raises UsageError for an input string that cannot be sent as UTF-8: bytes of the
    command line that are not UTF-8 (Python keeps them as U+DC80..U+DCFF,
    "surrogateescape") or a lone surrogate (no Unicode character)."""
    for flag in INPUT_FLAGS:
        for number, value in enumerate(getattr(args, flag), start=1):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as err:
                char = value[err.start]
                what = (f"byte 0x{ord(char) - 0xDC00:02x} is not valid UTF-8"
                        if 0xDC80 <= ord(char) <= 0xDCFF else
                        f"U+{ord(char):04X} is a lone surrogate, not a character")
                raise UsageError(f"--{flag} #{number}: {what} (at character {err.start}); "
                                 "inputs must be UTF-8 text") from None


def _check_output(path: str, input_file: str, export_dir: str) -> None:
    """Raises UsageError, before any work, for an --output_json that cannot be written
    (a directory, a missing or read-only folder) or must not be: the --input_file (`-` is
    stdin, not a file) or a file inside --export_dir. Names are compared as the files they
    reach (relative or absolute, through symbolic links)."""
    import tensorflow as tf

    if not path:
        return
    folder = os.path.dirname(path.rstrip("/")) or "."
    if tf.io.gfile.isdir(path):
        raise UsageError(f"--output_json={path} is a directory; give a file name")
    if input_file and input_file != "-" and _within(path, input_file):
        raise UsageError(f"--output_json={path} is the --input_file ({input_file}); writing "
                         "it would destroy the inputs: give another file name")
    if _within(path, export_dir):
        raise UsageError(f"--output_json={path} lies inside --export_dir={export_dir}; "
                         "writing it would alter the export: give a file outside it")
    if not tf.io.gfile.isdir(folder):
        raise UsageError(f"--output_json={path}: the folder {folder} does not exist")
    if "://" not in path and not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--output_json={path}: the folder {folder} is not writable")


def _within(path: str, other: str) -> bool:
    """True when `path` is `other` or lies inside it: local names resolved (relative or
    absolute, symbolic links), URLs compared as written."""
    if "://" in path or "://" in other:
        path, other = path.rstrip("/"), other.rstrip("/")
        return path == other or path.startswith(other + "/")
    path, other = os.path.realpath(path), os.path.realpath(other)
    return os.path.commonpath([path, other]) == other


def _write_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` all-or-nothing: a hidden temporary beside it (named as
    data_prep.fileio names them, so its cleaning recognises one left by a kill), synced,
    then renamed over it. Inline because this script imports only tensorflow and
    tensorflow_text (no project code: it checks that an export serves on its own)."""
    import tensorflow as tf

    folder, name = os.path.split(path)
    host = os.uname().nodename.replace("-", "_").replace(".", "_") or "host"
    temp = os.path.join(folder, f".{name}.tmp-{host}-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        if "://" in path:
            with tf.io.gfile.GFile(temp, "w") as writer:
                writer.write(text)
            tf.io.gfile.rename(temp, path, overwrite=True)
            return
        with open(temp, "w", encoding="utf-8", newline="\n") as writer:
            writer.write(text)
            writer.flush()
            os.fsync(writer.fileno())
        os.replace(temp, path)
        directory = os.open(folder or ".", os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except BaseException:
        try:
            if tf.io.gfile.exists(temp):
                tf.io.gfile.remove(temp)
        except Exception:  # noqa: BLE001  (best effort: failing anyway)
            pass
        raise


def _read_lines(path: str) -> list:
    """(line number, text) of the non-blank lines of --input_file (`-`: stdin), UTF-8;
    UsageError naming the file (and line) when it cannot be read."""
    name = "stdin" if path == "-" else path
    try:
        if path == "-":
            raw = sys.stdin.buffer.read()
        elif "://" in path:
            import tensorflow as tf

            with tf.io.gfile.GFile(path, "rb") as reader:
                raw = reader.read()
        else:
            with open(path, "rb") as reader:
                raw = reader.read()
    except IsADirectoryError:
        raise UsageError(f"--input_file={path} is a directory; give a file") from None
    except Exception as err:  # noqa: BLE001 - OSError locally, tf.errors for URLs
        if not isinstance(err, OSError) and type(err).__module__.split(".")[0] != "tensorflow":
            raise
        raise UsageError(f"--input_file={path}: cannot read it ({err})") from None
    lines = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        try:
            text = line.rstrip(b"\r").decode("utf-8")
        except UnicodeDecodeError as err:
            raise UsageError(f"{name}:{number}: byte 0x{line[err.start]:02x} is not valid "
                             f"UTF-8 (at byte {err.start}); inputs must be UTF-8 text") from None
        if text.strip():
            lines.append((number, text))
    if not lines:
        raise UsageError(f"--input_file={path}: no input (the file is empty or blank)")
    return lines


def _file_inputs(path: str, lines: list, expected: set) -> dict:
    """The signature's inputs from --input_file's lines: each line a text when the model
    takes single texts ({"text"}), else a JSON object keyed by the input flags' names
    (--ending: a list). UsageError naming the file and line."""
    name = "stdin" if path == "-" else path
    if expected == {"text"}:
        return {"text": [text for _, text in lines]}
    keys = {"endings": "ending"}  # signature input -> its flag (and JSON key)
    wanted = sorted(keys.get(key, key) for key in expected)
    given = {key: [] for key in expected}
    for number, text in lines:
        try:
            row = json.loads(text)
        except ValueError as err:
            raise UsageError(f"{name}:{number}: not a JSON object ({err}); this model takes "
                             f"one per line, with the keys {wanted}") from None
        if not isinstance(row, dict):
            raise UsageError(f"{name}:{number}: not a JSON object; this model takes one per "
                             f"line, with the keys {wanted}")
        if "ending" in row and "question" in expected:
            row.setdefault("question", "")
        if set(row) != set(wanted):
            raise UsageError(f"{name}:{number}: keys {sorted(row)}; this model takes "
                             f"{wanted}")
        for key in expected:
            value = row[keys.get(key, key)]
            if key == "endings":
                if not (isinstance(value, list) and value and
                        all(isinstance(v, str) for v in value)):
                    raise UsageError(f"{name}:{number}: \"ending\" must be a list of texts")
                if given[key] and len(value) != len(given[key][0]):
                    raise UsageError(f"{name}:{number}: {len(value)} endings, the lines above "
                                     f"{len(given[key][0])}: every input needs as many")
            elif not isinstance(value, str):
                raise UsageError(f"{name}:{number}: {keys.get(key, key)!r} must be a text")
            given[key].append(value)
    return given


def _inputs(parser, args) -> dict:
    given = {name: getattr(args, name) for name in ("text", "text_pair", "question", "context")
             if getattr(args, name)}
    if args.input_file:
        if given or args.ending:
            parser.error("--input_file replaces the input flags (--text, --text_pair, "
                         "--question, --context, --ending): give one or the other")
        return {}
    if not given:
        parser.error("give at least one --text (or --question and --context), or "
                     "--input_file")
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


def _shown(value) -> str:
    """An input as its line shows it: a long text by its start and its length."""
    if isinstance(value, str) and len(value) > 100:
        return f"{value[:60]!r}... ({len(value)} characters)"
    return repr(value)


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
    if isinstance(row.get("embedding"), list):
        vector = row["embedding"]
        norm = sum(x * x for x in vector) ** 0.5
        return (f"embedding [{len(vector)}], L2 norm {norm:.4f}: "
                + " ".join(f"{x:.4f}" for x in vector[:4]) + " ...")
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


def _error(message: str) -> int:
    print(f"predict_saved_model.py: error: {message}", file=sys.stderr)
    return 1


def _reason(message: str) -> str:
    """The readable part of a graph error: a failed assertion's own message, else the
    first line."""
    start = message.find("assertion failed: [")
    if start >= 0:
        text = message[start + len("assertion failed: ["):]
        return text.split("] [", 1)[0].rstrip("]")
    return message.strip().splitlines()[0] if message.strip() else "no reason given"


def _refused(function, feed: dict, err) -> str:
    """Which input(s) the export refused (each row is tried alone) and the graph's reason,
    e.g. a context needing more windows than the export's max_context_windows."""
    import tensorflow as tf

    count = int(next(iter(feed.values())).shape[0])
    bad = [1] if count == 1 else []
    for i in range(count if count > 1 else 0):
        try:
            function(**{name: values[i:i + 1] for name, values in feed.items()})
        except tf.errors.InvalidArgumentError:
            bad.append(i + 1)
    flags = ", ".join("--ending" if name == "endings" else f"--{name}" for name in feed)
    where = (f"input #{', #'.join(map(str, bad))} ({flags})" if bad
             else f"the inputs ({flags}) together")
    return f"{where} refused by the export: {_reason(err.message)}"


def _terminated(signum, frame):
    """SIGTERM (and SIGHUP) end the run as every command's do: status 128 + signal, through
    the `finally` blocks (--output_json's temporary goes)."""
    del frame
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    """The command: its exit status. Bad input is one `error:` line (status 1); Ctrl-C one
    line and status 130, SIGTERM 143 (the signal handlers are the caller's again
    afterwards); anything else is a defect: its traceback, then a line saying so (status
    1), as every command of the repository (`data_prep.cli`) ends."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _terminated)
                    for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return _run(argv)
    except KeyboardInterrupt:
        print("predict_saved_model.py: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        return 130
    except Exception as err:  # noqa: BLE001 - not bad input: a defect to report
        traceback.print_exc()
        message = "; ".join(line.strip() for line in str(err).splitlines() if line.strip())
        print(f"predict_saved_model.py: internal error (a bug, please report it with the "
              f"traceback above): {type(err).__name__}: {message}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(argv) -> int:
    parser, args = _parse(argv)
    inputs = _inputs(parser, args)
    try:
        _check_utf8(args)
        lines = _read_lines(args.input_file) if args.input_file else None
    except UsageError as err:
        return _error(str(err))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  -- registers the ops the graph uses

    try:
        _check_output(args.output_json, args.input_file, args.export_dir)
    except UsageError as err:
        return _error(str(err))
    try:
        model = tf.saved_model.load(args.export_dir)
    except (OSError, ValueError) as err:
        return _error(f"cannot load {args.export_dir}: "
                      + "; ".join(line.strip() for line in str(err).splitlines() if line.strip()))
    if args.signature not in model.signatures:
        return _error(f"no signature {args.signature!r} in {args.export_dir} (it has: "
                      f"{', '.join(sorted(model.signatures))})")
    function = model.signatures[args.signature]
    expected = set(function.structured_input_signature[1])
    if lines is not None:
        try:
            inputs = _file_inputs(args.input_file, lines, expected)
        except UsageError as err:
            return _error(str(err))
    if set(inputs) != expected:
        return _error(f"signature {args.signature!r} takes {sorted(expected)}, got "
                      f"{sorted(inputs)}")
    feed = {name: tf.constant(values, tf.string) for name, values in inputs.items()}
    try:
        outputs = function(**feed)
    except tf.errors.InvalidArgumentError as err:
        return _error(_refused(function, feed, err))
    outputs = {key: _to_python(value.numpy()) for key, value in outputs.items()}
    count = len(next(iter(inputs.values())))
    rows = _rows(outputs, count)
    labels = _labels(args.export_dir)
    for i, row in enumerate(rows):
        shown = " | ".join(_shown(values[i]) for values in inputs.values())
        print(f"{shown} -> {_describe(row, labels)}")
    if args.output_json:
        document = {"export_dir": args.export_dir, "signature": args.signature,
                    "inputs": inputs, "labels": labels, "predictions": rows}
        try:
            _write_atomically(args.output_json,
                              json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        except (OSError, tf.errors.OpError) as err:
            return _error(f"--output_json={args.output_json}: cannot write it: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
