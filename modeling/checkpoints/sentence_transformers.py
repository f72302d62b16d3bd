"""Owns sentence-transformers model directories: reading what their modules say (the BERT weights' place, tokenization, pooling, normalization) and writing that description back.

A sentence-transformers model is a directory with ``modules.json``, a list of modules run
in order. This project reads the ones a BERT sentence encoder is made of, and refuses
every other (naming it, never ignoring it):

* a ``Transformer`` module (``path`` "" or e.g. "0_Transformer"): a Hugging Face BERT
  directory (``config.json``, ``model.safetensors``, ``vocab.txt``) whose last layer's
  token vectors the next module pools. Its ``sentence_bert_config.json`` gives
  ``max_seq_length`` (else ``tokenizer_config.json``'s ``model_max_length``, capped at
  ``max_position_embeddings``, as sentence-transformers 6 reads it) and its
  ``tokenizer_config.json`` the casing (``do_lower_case``, which Hugging Face's tokenizer
  follows even beside a ``tokenizer.json``);
* a ``Pooling`` module (its ``config.json``): one of ``POOLING_MODES``, in the legacy form
  (``pooling_mode_mean_tokens``: true, ...) or sentence-transformers 6's
  (``"pooling_mode": "mean"``);
* an optional ``Normalize`` module (L2; its folder may be absent, as in the published
  all-MiniLM-L6-v2).

``read`` returns the model's description (``SentenceTransformersModel``);
``description_files`` writes one back beside converted weights (``convert``), so that a
conversion keeps the pooling, normalization, casing and length: sentence-transformers
loads the ``hf`` output as it loaded the input, and this project reads every kind. A
directory saved by sentence-transformers 6 has no ``vocab.txt``, only ``tokenizer.json``:
``convert`` writes ``vocab.txt`` from it (``vocab_from_tokenizer_json``), the other
commands ask for ``--vocab_file``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import tensorflow as tf

from modeling.checkpoints.common import CheckpointError

MODULES_FILE = "modules.json"
# What the project computes (modeling docs: "sentence embeddings"): sentence-transformers'
# other modes (mean_sqrt_len_tokens, weightedmean, lasttoken, several at once) are refused.
POOLING_MODES = ("cls", "mean", "max")
_LEGACY_MODE_KEYS = {
    "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens":
    "mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken"}
# sentence_bert_config.json keys whose values change nothing this project computes when
# they are as written here (None: any value).
_HARMLESS_KEYS = {
    "transformer_task": "feature-extraction", "module_output_name": "token_embeddings",
    "unpad_inputs": None, "backend": "torch", "max_seq_length": None, "do_lower_case": None,
    "modality_config": {"text": {"method": "forward",
                                 "method_output_name": "last_hidden_state"}}}


@dataclasses.dataclass(frozen=True)
class SentenceTransformersModel:
    """What a sentence-transformers directory describes.

    Attributes:
      directory: the model directory (holding ``modules.json``).
      transformer_dir: the Transformer module's directory (weights, config, vocab).
      max_seq_length: the longest input, special tokens included (longer ones are cut).
      do_lower_case: the tokenizer's casing.
      pooling: one of ``POOLING_MODES``.
      normalize: the vectors are L2-normalized (a ``Normalize`` module).
      sources: setting name -> the file that set it (for messages).
    """

    directory: str
    transformer_dir: str
    max_seq_length: int
    do_lower_case: bool
    pooling: str
    normalize: bool
    sources: dict = dataclasses.field(default_factory=dict, compare=False)

    def settings(self) -> dict:
        """The settings a run takes from the model, by the runners' flag names."""
        return {"max_seq_length": self.max_seq_length, "do_lower_case": self.do_lower_case,
                "pooling": self.pooling, "normalize": self.normalize}

    def overrides(self, given: dict) -> list:
        """One message per flag in ``given`` ({flag name: value}) that sets a value other
        than the model's (``settings``, ``--layers`` other than the last, which
        sentence-transformers pools, ``--vocab_file``, ``--bert_config_file``): what the
        runners log."""
        messages = []
        settings = self.settings()
        for name, value in given.items():
            if name in settings and value != settings[name]:
                messages.append(f"--{name}={_flag_text(value)} overrides the "
                                f"sentence-transformers model's {name}="
                                f"{_flag_text(settings[name])} ({self.sources[name]})")
            elif name == "layers" and str(value).replace(" ", "") != "-1":
                messages.append(f"--layers={value} overrides the sentence-transformers "
                                "model's pooled layer, the last (-1)")
            elif name in ("vocab_file", "bert_config_file") and value:
                messages.append(f"--{name}={value} overrides the file of the "
                                f"sentence-transformers model in {self.transformer_dir}")
        return messages


def _flag_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def is_sentence_transformers(path: str) -> bool:
    """True when ``path`` is a directory with ``modules.json``."""
    path = os.fspath(path)
    return tf.io.gfile.isdir(path) and tf.io.gfile.exists(os.path.join(path, MODULES_FILE))


def _read_json(path: str, what: str, required: bool = True):
    if not tf.io.gfile.exists(path):
        if required:
            raise CheckpointError(f"{path}: missing ({what})")
        return None
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None


def _module_kind(entry) -> str:
    """"Transformer", "Pooling", "Normalize" or "" for a module this project does not run:
    the class name of ``type`` in sentence-transformers' package (any version's path)."""
    kind = entry.get("type") if isinstance(entry, dict) else None
    if not isinstance(kind, str) or not kind.startswith("sentence_transformers."):
        return ""
    name = kind.rsplit(".", 1)[-1]
    return name if name in ("Transformer", "Pooling", "Normalize") else ""


def _modules(directory: str) -> list:
    """modules.json's entries, checked: Transformer, Pooling, then optionally Normalize."""
    path = os.path.join(directory, MODULES_FILE)
    entries = _read_json(path, "the module list")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise CheckpointError(f"{path}: expected a JSON list of modules "
                              '({"idx", "name", "path", "type"} each)')
    expected = ["Transformer", "Pooling", "Normalize"]
    for number, entry in enumerate(entries):
        kind = _module_kind(entry)
        described = (f"module {entry.get('idx', number)} ({entry.get('type')!r}, path "
                     f"{entry.get('path')!r})")
        if not kind:
            raise CheckpointError(
                f"{path}: {described} is not supported: this project runs a BERT "
                "Transformer, a Pooling and an optional Normalize module, and refuses a "
                "model with any other (a Dense projection, ...) rather than compute "
                "other vectors than sentence-transformers does")
        if number >= len(expected) or kind != expected[number]:
            raise CheckpointError(
                f"{path}: {described} is out of place: expected the modules "
                "Transformer, Pooling (and optionally Normalize), in that order")
        if not isinstance(entry.get("path", ""), str):
            raise CheckpointError(f"{path}: {described}: 'path' must be a string")
    if len(entries) < 2:
        raise CheckpointError(f"{path}: {len(entries)} module(s); expected a Transformer and "
                              "a Pooling module (and optionally Normalize)")
    return entries


def _pooling(directory: str, entry: dict, hidden_size: Optional[int]) -> tuple:
    """(mode, the file) of the Pooling module."""
    path = os.path.join(directory, entry.get("path", ""), "config.json")
    config = _read_json(path, "the Pooling module's configuration")
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    if "pooling_mode" in config:
        modes = config["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else modes
    else:  # the legacy booleans; none set means mean, as sentence-transformers reads it
        modes = [mode for key, mode in _LEGACY_MODE_KEYS.items() if config.get(key)]
        modes = modes or ["mean"]
    if not isinstance(modes, list) or len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise CheckpointError(
            f"{path}: pooling {modes!r} is not implemented here: one of "
            f"{', '.join(POOLING_MODES)} (not several at once)")
    dimension = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    if hidden_size is not None and dimension not in (None, hidden_size):
        raise CheckpointError(f"{path}: embedding dimension {dimension} differs from the "
                              f"Transformer's hidden_size {hidden_size}")
    return modes[0], path


def _casing(transformer_dir: str, lowercase_input: bool, bert_config: str) -> tuple:
    """(do_lower_case, the file that set it, the tokenizer's configuration)."""
    path = os.path.join(transformer_dir, "tokenizer_config.json")
    config = _read_json(path, "the tokenizer's configuration", required=False) or {}
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    tokenizer = config.get("tokenizer_class", "BertTokenizer")
    if tokenizer not in ("BertTokenizer", "BertTokenizerFast"):
        raise CheckpointError(f"{path}: tokenizer_class {tokenizer!r} is not BERT's "
                              "WordPiece tokenizer (BertTokenizer)")
    lower = config.get("do_lower_case", True)  # BertTokenizer's default
    if not isinstance(lower, bool):
        raise CheckpointError(f"{path}: do_lower_case must be true or false, got {lower!r}")
    strip = config.get("strip_accents")
    if strip is not None and strip != lower:
        raise CheckpointError(
            f"{path}: strip_accents={json.dumps(strip)} with do_lower_case="
            f"{json.dumps(lower)} is not implemented (BERT strips accents exactly when it "
            "lower-cases)")
    for key in ("tokenize_chinese_chars", "do_basic_tokenize"):
        if config.get(key, True) is not True:
            raise CheckpointError(f"{path}: {key}={json.dumps(config[key])} is not "
                                  "implemented (BERT's tokenizer: true)")
    if lowercase_input and not lower:
        raise CheckpointError(
            f"{bert_config}: do_lower_case=true lower-cases the input before a cased "
            f"tokenizer ({path}: do_lower_case=false) without stripping accents, which this "
            "project's tokenizer does not do")
    return lower, (path if tf.io.gfile.exists(path) else "BertTokenizer's default"), config


def _transformer_settings(transformer_dir: str) -> dict:
    """sentence_bert_config.json, checked: keys that would change the vectors refused."""
    path = os.path.join(transformer_dir, "sentence_bert_config.json")
    config = _read_json(path, "the Transformer module's configuration", required=False) or {}
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    for key, value in config.items():
        if key in _HARMLESS_KEYS:
            if _HARMLESS_KEYS[key] is not None and value != _HARMLESS_KEYS[key]:
                raise CheckpointError(f"{path}: {key}={json.dumps(value)} is not implemented "
                                      f"(expected {json.dumps(_HARMLESS_KEYS[key])})")
        elif value not in (None, {}, [], ""):
            raise CheckpointError(f"{path}: {key}={json.dumps(value)[:200]} is not read by "
                                  "this project; refusing the model rather than ignoring it")
    return config


def _prompt(directory: str) -> None:
    """Refuses a default prompt (sentence-transformers would prepend it to every text)."""
    path = os.path.join(directory, "config_sentence_transformers.json")
    config = _read_json(path, "", required=False) or {}
    if isinstance(config, dict) and config.get("default_prompt_name"):
        raise CheckpointError(
            f"{path}: default_prompt_name={config['default_prompt_name']!r}: "
            "sentence-transformers prepends that prompt to every text, which this project "
            "does not do; prepend it to your input lines yourself and remove the setting")


def read(path: str) -> SentenceTransformersModel:
    """The description of the sentence-transformers directory ``path``.

    Raises:
      CheckpointError naming the file: a module other than Transformer, Pooling and
      Normalize (or out of that order), a pooling mode not in ``POOLING_MODES``, tokenizer
      or Transformer settings this project does not compute, a default prompt.
    """
    directory = os.fspath(path).rstrip("/") or "/"
    entries = _modules(directory)
    transformer_dir = os.path.join(directory, entries[0].get("path", "")).rstrip("/")
    if not tf.io.gfile.isdir(transformer_dir):
        raise CheckpointError(f"{os.path.join(directory, MODULES_FILE)}: the Transformer "
                              f"module's folder {transformer_dir} does not exist")
    bert_config_path = os.path.join(transformer_dir, "sentence_bert_config.json")
    settings = _transformer_settings(transformer_dir)
    hf_config = _read_json(os.path.join(transformer_dir, "config.json"),
                           "the Transformer's Hugging Face config", required=False)
    hf_config = hf_config if isinstance(hf_config, dict) else {}
    pooling, pooling_path = _pooling(directory, entries[1], hf_config.get("hidden_size"))
    lower, casing_path, tokenizer = _casing(transformer_dir,
                                            bool(settings.get("do_lower_case")),
                                            bert_config_path)
    _prompt(directory)
    max_positions = hf_config.get("max_position_embeddings", 512)
    if settings.get("max_seq_length") is not None:
        length, length_path = settings["max_seq_length"], bert_config_path
    elif isinstance(tokenizer.get("model_max_length"), int):
        length = min(tokenizer["model_max_length"], max_positions)
        length_path = os.path.join(transformer_dir, "tokenizer_config.json")
    else:
        length, length_path = max_positions, os.path.join(transformer_dir, "config.json")
    if not isinstance(length, int) or length < 3:
        raise CheckpointError(f"{length_path}: max_seq_length {length!r} cannot hold "
                              "[CLS] a token [SEP]")
    normalize = len(entries) == 3
    return SentenceTransformersModel(
        directory=directory, transformer_dir=transformer_dir, max_seq_length=length,
        do_lower_case=lower, pooling=pooling, normalize=normalize,
        sources={"max_seq_length": length_path, "do_lower_case": casing_path,
                 "pooling": pooling_path,
                 "normalize": f"{os.path.join(directory, MODULES_FILE)}: "
                              f"{'a' if normalize else 'no'} Normalize module"})


def vocab_from_tokenizer_json(transformer_dir: str) -> Optional[str]:
    """vocab.txt's text (one token per line, in id order) from the WordPiece vocabulary of
    the Transformer's ``tokenizer.json`` (sentence-transformers 6 and transformers 5 save
    only that file), or None when there is no ``tokenizer.json``."""
    path = os.path.join(transformer_dir, "tokenizer.json")
    data = _read_json(path, "", required=False)
    if data is None:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, dict) or model.get("type") != "WordPiece":
        raise CheckpointError(f"{path}: expected a WordPiece tokenizer (\"model\": "
                              "{\"type\": \"WordPiece\", \"vocab\": {token: id}})")
    tokens = sorted(vocab, key=vocab.get)
    if [vocab[t] for t in tokens] != list(range(len(tokens))) or any(
            "\n" in t or t != t.strip() for t in tokens):
        raise CheckpointError(f"{path}: the WordPiece ids are not 0..{len(tokens) - 1}, once "
                              "each, or a token cannot be a line of vocab.txt")
    return "".join(token + "\n" for token in tokens)


def description_files(pooling: str, normalize: bool, max_seq_length: int,
                      do_lower_case: bool, hidden_size: int) -> dict:
    """{file name relative to the model directory: text}: the files that make a directory
    of BERT weights (Transformer path "") the sentence-transformers model with these
    settings, in the legacy forms every sentence-transformers version reads."""
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling {pooling!r} is not one of {POOLING_MODES}")
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    pooling_config = {"word_embedding_dimension": hidden_size}
    pooling_config.update({key: mode == pooling for key, mode in _LEGACY_MODE_KEYS.items()})

    def text(value):
        return json.dumps(value, indent=2) + "\n"

    return {MODULES_FILE: text(modules),
            os.path.join("1_Pooling", "config.json"): text(pooling_config),
            "sentence_bert_config.json": text({"max_seq_length": max_seq_length,
                                               "do_lower_case": False}),
            "tokenizer_config.json": text({"tokenizer_class": "BertTokenizer",
                                           "do_lower_case": do_lower_case})}
