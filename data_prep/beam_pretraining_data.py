"""Apache Beam pipeline: raw text -> pretraining TFRecords, on one machine or a cluster.

    python -m data_prep.beam_pretraining_data \\
        --input_file='corpus/*.txt' --output_file=out/train.tfrecord --vocab_file=vocab.txt \\
        --num_output_shards=16 [--runner=DataflowRunner --project=... --region=... ...]

The flags both pretraining-data drivers share (`pretraining_cli`: the original's, with
their names, meanings and defaults, plus --num_output_shards, --gzip, --chunk_size_mb,
--exact_draws, --dynamic_masking, --next_sentence_prediction, --mask_token_rate,
--random_token_rate), this driver's `--pool_size_mb`, and any Apache Beam
pipeline option (`--runner`, `--direct_num_workers`, Dataflow's `--project`/`--region`/
`--temp_location`/`--num_workers`, Flink's `--flink_master`, Spark's
`--spark_master_url`, ...), passed to Beam. Without `--runner` the pipeline runs here on
the DirectRunner's in-process engine (`FnApiRunner`, which never downloads anything).
See docs/beam_pretraining_data.md.

The algorithm is `pretraining_data`'s, the one the local pipeline runs: only the driver
differs.

1. The driver cuts the input files into chunks at document boundaries
   (`documents.plan_chunks`); workers read and tokenize them. Each document's key
   is (input file number, byte offset of its first line), whatever the chunks.
2. Documents are dealt to pools by a hash of (seed, key): a pool is about
   `--pool_size_mb` of text drawn from the whole corpus, the unit in which
   `instances.unit_instances` builds instances (random next sentences come from
   the pool) with the generators of the seed and the pool number. Its documents are
   sorted by key first, so a pool's instances depend on the seed and the input only. A
   corpus within one pool, with --exact_draws, gives exactly the original's instances.
3. Each record gets a 64-bit hash of (seed, pool, its number in the pool); the records
   are sorted by it (a global shuffle, as TFDS shuffles) and output file f of F holds the
   hash range [f/F, (f+1)/F). Sorting happens in buckets (hash ranges of at most about
   BUCKET_RECORDS records, written to a work folder) that are then concatenated in order,
   so no worker holds more than a bucket or a pool.

Output therefore depends on the flags and the input only: not on the runner, the number
of workers, bundles or chunks. Files are written under hidden temporary names and renamed
into place, with the summary (`DIR/_NAME.summary.json`), only when the pipeline
succeeded (`fileio.AtomicOutputs`, synced on a local disk). The sorting buckets live in a
hidden work folder (`fileio.work_directory`), removed at the end; one that a killed run
left is removed by the next run with the same first output.

Paths may be local or any `tf.io.gfile` URL (gs://, ...): workers read and write through
`fileio`, so every path must be one they all see (on a cluster: gs://, not a local
disk). The temporaries are written by the workers, so they live beside the outputs on
the same file system, also on an object store, where putting them in place is a copy
(`fileio.AtomicOutputs(..., shared_temporaries=True)`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import time
import typing

import apache_beam as beam
from absl import flags, logging
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineState

from data_prep import cli, features, fileio, pretraining_cli
from data_prep.pretraining_data.chunks import load_tokenizer
from data_prep.pretraining_data.documents import plan_chunks, read_documents
from data_prep.pretraining_data.instances import unit_instances
from data_prep.pretraining_data.records import CompactSerializer, record_encoder
from data_prep.pretraining_data.stats import Stats

FLAGS = flags.FLAGS

# Records per sorting bucket, at most about (a bucket is sorted in one worker's memory:
# ~65k records of 128 tokens are ~50 MB).
BUCKET_RECORDS = 65536


def define_flags() -> None:
    """The shared flags (`pretraining_cli`) and this driver's own, when the command starts.
    The local pool's flags are not defined: here Beam's options (--direct_num_workers,
    Dataflow's --max_num_workers, ...) decide the parallelism, and the shuffle is global."""
    pretraining_cli.define_flags()
    flags.DEFINE_float(
        "pool_size_mb", 16.0,
        "Megabytes of text per pool: documents are dealt to pools by a hash, across all "
        "input files; random next sentences are drawn from the document's pool, and a "
        "worker holds one pool at a time (about 40 MB of memory per MB of text at "
        "dupe_factor 10).")


@dataclasses.dataclass(frozen=True)
class BeamJob(pretraining_cli.DataJob):
    """One run of the pipeline: the shared job (hash range f of F goes to outputs[f]) and
    the size of a pool."""

    pool_bytes: int = 16 * 1024 * 1024


# ---------------------------------------------------------------------------------------
# Stable keys and hashes.


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()


def _hash64(text: str) -> int:
    return int.from_bytes(_digest(text), "big")


def pool_of(seed: int, key: tuple, num_pools: int) -> int:
    """The pool of the document with key (file number, byte offset)."""
    return _hash64(f"{seed}/pool/{key[0]}/{key[1]}") % num_pools if num_pools > 1 else 0


def record_key(seed: int, pool: int, number: int) -> bytes:
    """The sort key of record `number` of `pool`: 8 hash bytes, the global shuffle.
    (Bytes, not an int: Beam's integer coder stops at 2**63.)"""
    return _digest(f"{seed}/record/{pool}/{number}")


def buckets_per_file(total_records: int, num_files: int) -> int:
    return max(1, math.ceil(total_records / num_files / BUCKET_RECORDS))


def bucket_of(key: bytes, num_files: int, per_file: int) -> int:
    """Global bucket number; bucket // per_file is the output file (the key's hash range
    of num_files), and buckets in order are hash ranges in order."""
    return (int.from_bytes(key, "big") * num_files * per_file) >> 64


# ---------------------------------------------------------------------------------------
# The pipeline's steps (module-level, so workers import them rather than unpickle code).


# Output types of the main outputs (Beam would otherwise infer them from the generators,
# tagged outputs included, and refuse the GroupByKey after them).
@beam.typehints.with_output_types(typing.Tuple[int, typing.Any])
class ReadDocuments(beam.DoFn):
    """(chunk number, byte ranges) -> (pool, ((file number, offset), document)); the
    chunk's reading statistics go to the "stats" output."""

    def __init__(self, job: BeamJob, file_numbers: dict, num_pools: int):
        self.job = job
        self.file_numbers = file_numbers
        self.num_pools = num_pools

    def process(self, element):
        _, ranges = element
        tokenize_ids, _ = load_tokenizer(self.job.vocab_file, self.job.do_lower_case)
        stats = Stats()
        starts: list = []
        documents = read_documents(ranges, tokenize_ids, stats, starts)
        for (path, offset), document in zip(starts, documents):
            key = (self.file_numbers[path], offset)
            yield pool_of(self.job.seed, key, self.num_pools), (key, document)
        yield beam.pvalue.TaggedOutput("stats", stats)


@beam.typehints.with_output_types(typing.Tuple[bytes, bytes])
class BuildPool(beam.DoFn):
    """(pool, [(key, document)]) -> (sort key, framed record) per instance; the pool's
    statistics go to "stats", its number of records to "counts"."""

    def __init__(self, job: BeamJob):
        self.job = job

    def process(self, element):
        pool, keyed = element
        job = self.job
        _, masking_vocab = load_tokenizer(job.vocab_file, job.do_lower_case)
        documents = [document for _, document in sorted(keyed, key=lambda kd: kd[0])]
        stats = Stats()
        compact = unit_instances(
            documents, job.config, masking_vocab, seed=job.seed, index=pool,
            exact_draws=job.exact_draws, dynamic_masking=job.dynamic_masking, stats=stats)
        del documents
        serializer = CompactSerializer(record_encoder(job.config, job.dynamic_masking),
                                       masking_vocab)
        number = 0
        for records, lengths in serializer.blocks(compact):
            data, framed_lengths = features.frame_concatenated(records, lengths)
            pos = 0
            for length in framed_lengths:
                yield record_key(job.seed, pool, number), data[pos:pos + length]
                pos += length
                number += 1
        yield beam.pvalue.TaggedOutput("counts", number)
        yield beam.pvalue.TaggedOutput("stats", stats)


def _to_bucket(element, total, num_files):
    key, _ = element
    return bucket_of(key, num_files, buckets_per_file(total, num_files)), element


def write_bucket(element, work_dir: str, num_files: int, total: int):
    """Sorts a bucket's records by key and writes them, framed, to the work folder;
    returns (file number, (bucket, path, records))."""
    bucket, records = element
    records = sorted(records)
    path = f"{work_dir}/bucket-{bucket:09d}"
    with fileio.open_file(path, "wb") as f:
        for _, record in records:
            f.write(record)
    per_file = buckets_per_file(total, num_files)
    return bucket // per_file, (bucket, path, len(records))


def open_record_file(path: str, gzip: bool):
    """A binary writer for framed records; GZIP as create_pretraining_data writes it
    (level 6, no name or time stamp: the same bytes every run)."""
    raw = fileio.open_file(path, "wb")
    if not gzip:
        return raw, raw
    import gzip as gzip_module

    return gzip_module.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6,
                                mtime=0), raw


def write_file(element, temps: tuple, gzip: bool):
    """Concatenates a file's buckets in order into its temporary; returns (file, records)."""
    number, buckets = element
    out, raw = open_record_file(temps[number], gzip)
    count = 0
    try:
        for _, path, records in sorted(buckets):
            with fileio.open_file(path, "rb") as f:
                while True:
                    block = f.read(1 << 20)
                    if not block:
                        break
                    out.write(block)
            count += records
    finally:
        out.close()
        if out is not raw:
            raw.close()
    for _, path, _ in buckets:
        fileio.remove(path)
    return number, count


def _merge_stats(stats_list):
    total = Stats()
    for stats in stats_list:
        total.add(stats)
    return total


def _write_json(value, path: str):
    with fileio.open_file(path, "w") as f:
        f.write(json.dumps(value, sort_keys=True))


@dataclasses.dataclass(frozen=True)
class Plan:
    chunks: list  # [(chunk number, (ByteRange, ...))]
    file_numbers: dict  # input path -> its number (position in the input list)
    num_pools: int
    total_bytes: int
    split_documents: int  # documents cut at a chunk boundary (no blank line in reach)


def plan(job: BeamJob) -> Plan:
    """Chunks, pools and input sizes (on the driver; reads only near chunk boundaries)."""
    total_bytes = sum(fileio.getsize(f) for f in job.input_files)
    if total_bytes == 0:
        raise cli.UserError(f"--input_file: the input is empty ({', '.join(job.input_files)})")
    chunk_bytes = job.chunk_bytes or pretraining_cli.auto_chunk_bytes(total_bytes)
    chunks, warnings = plan_chunks(list(job.input_files), chunk_bytes)
    for warning in warnings:
        logging.warning("%s", warning)
    return Plan(chunks=list(enumerate(chunks)),
                file_numbers={path: i for i, path in enumerate(job.input_files)},
                num_pools=max(1, math.ceil(total_bytes / job.pool_bytes)),
                total_bytes=total_bytes, split_documents=len(warnings))


def build_pipeline(pipeline, job: BeamJob, the_plan: Plan, work_dir: str, temps: tuple):
    """Adds the steps to `pipeline`: records into `temps` (one per output, hash ranges in
    order; a file that gets no record is not written), the statistics into
    `work_dir/stats.json`."""
    num_files = len(temps)
    read = (pipeline
            | "Chunks" >> beam.Create(the_plan.chunks)
            | "SpreadChunks" >> beam.Reshuffle()
            | "Read" >> beam.ParDo(ReadDocuments(job, the_plan.file_numbers,
                                                 the_plan.num_pools)
                                   ).with_outputs("stats", main="documents"))
    built = (read.documents
             | "GroupPools" >> beam.GroupByKey()
             | "BuildPools" >> beam.ParDo(BuildPool(job)).with_outputs(
                 "stats", "counts", main="records"))
    total = built.counts | "CountRecords" >> beam.CombineGlobally(sum)
    total_side = beam.pvalue.AsSingleton(total)
    _ = (built.records
         | "KeyByBucket" >> beam.Map(_to_bucket, total=total_side, num_files=num_files)
         | "GroupBuckets" >> beam.GroupByKey()
         | "WriteBuckets" >> beam.Map(write_bucket, work_dir=work_dir, num_files=num_files,
                                      total=total_side)
         | "GroupFiles" >> beam.GroupByKey()
         | "WriteFiles" >> beam.Map(write_file, temps=tuple(temps), gzip=job.gzip))
    _ = ((read.stats, built.stats)
         | "AllStats" >> beam.Flatten()
         | "MergeStats" >> beam.CombineGlobally(_merge_stats)
         | "StatsJson" >> beam.Map(dataclasses.asdict)
         | "WriteStats" >> beam.Map(_write_json, path=f"{work_dir}/stats.json"))
    return pipeline


def run_job(job: BeamJob, options: PipelineOptions) -> dict:
    """Runs the pipeline; on success the records and the summary are in place together,
    otherwise nothing is (earlier outputs stay as they were). Returns the summary."""
    start = time.monotonic()
    the_plan = plan(job)
    logging.info("%d input file(s), %.1f MB, %d chunk(s), %d pool(s) of ~%.2f MB",
                 len(job.input_files), the_plan.total_bytes / 1e6, len(the_plan.chunks),
                 the_plan.num_pools, the_plan.total_bytes / the_plan.num_pools / 1e6)
    finals = list(job.outputs) + [job.summary_path]
    # The workers write the temporaries: beside the outputs, where they all can.
    with fileio.AtomicOutputs(finals, shared_temporaries=True) as atomic:
        temps = tuple(atomic.temp(path) for path in job.outputs)
        # DIR/.NAME.beam-work.tmp-HOST-PID-HEX; a killed run's is removed here.
        with fileio.work_directory(job.outputs[0] + ".beam-work") as work_dir:
            pipeline = beam.Pipeline(options=options)
            build_pipeline(pipeline, job, the_plan, work_dir, temps)
            result = pipeline.run()
            state = result.wait_until_finish()
            if state not in (None, PipelineState.DONE):
                raise cli.UserError(f"the pipeline ended in state {state}")
            with fileio.open_file(f"{work_dir}/stats.json", "r") as f:
                stats = Stats(**json.load(f))
        stats.split_documents += the_plan.split_documents
        if stats.instances == 0:
            raise cli.UserError(
                f"--input_file: no instances: the {stats.lines} line(s) of input hold no "
                f"text that tokenizes to anything ({', '.join(job.input_files)})")
        for temp in temps:  # a hash range that got no record: an empty file
            if not fileio.exists(temp):
                out, raw = open_record_file(temp, job.gzip)
                out.close()
                if out is not raw:
                    raw.close()
        elapsed = time.monotonic() - start
        summary = stats.summary()
        summary.update(
            seconds=round(elapsed, 3),
            mb_per_second=round(the_plan.total_bytes / 1e6 / elapsed, 4),
            instances_per_second=round(stats.instances / elapsed, 1),
            num_chunks=len(the_plan.chunks), num_pools=the_plan.num_pools,
            pool_bytes=job.pool_bytes, input_files=list(job.input_files),
            output_files=list(job.outputs), summary_file=job.summary_path, gzip=job.gzip,
            random_seed=job.seed, exact_draws=job.exact_draws,
            dynamic_masking=job.dynamic_masking, config=dataclasses.asdict(job.config),
            pipeline="beam", runner=options.view_as(StandardOptions).runner)
        with atomic.open(job.summary_path, "w", newline="\n") as f:
            f.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


# ---------------------------------------------------------------------------------------
# The CLI.


def unknown_pipeline_args(args) -> list:
    """The arguments that are neither this CLI's flags nor Beam pipeline options: those
    Beam's own parser of its options leaves unknown. `get_all_options` builds that parser
    from every option group and hands it to its `add_extra_args_fn` hook, where it parses
    `args` here (with `retain_unknown_options`, Beam itself warns about none of them).

    Beam's option groups are `PipelineOptions` subclasses, known once the module defining
    them is imported: `apache_beam.options.pipeline_options` (every standard group, the
    DirectRunner's, Dataflow's, Flink's, Spark's...) is, here; a group a plug-in module
    defines is known only if that module was imported first.
    """
    args = list(args)
    unknown = []
    PipelineOptions(args).get_all_options(
        retain_unknown_options=True,
        add_extra_args_fn=lambda parser: unknown.extend(parser.parse_known_args(args)[1]))
    return unknown


# Run on this machine by the DirectRunner's own in-process engine. Recent Beam versions'
# DirectRunner first try to download and start the "Prism" runner binary (which fails
# offline, after a network attempt); the engine it falls back to is this one.
LOCAL_RUNNER = "FnApiRunner"


def pipeline_options(args) -> PipelineOptions:
    """Beam's options from the arguments this CLI does not know. No --runner, or
    --runner=DirectRunner: the DirectRunner's in-process engine (LOCAL_RUNNER), which
    honours --direct_num_workers and --direct_running_mode."""
    unknown = unknown_pipeline_args(args)
    if unknown:
        raise cli.UserError(f"unknown flag(s) {' '.join(unknown)}: neither a flag of this "
                           "tool (--helpfull lists them) nor an Apache Beam pipeline option")
    args = list(args)
    runner = PipelineOptions(args).view_as(StandardOptions).runner
    if runner is None or runner.lower() in ("direct", "directrunner"):
        kept, skip = [], False
        for arg in args:  # drop --runner=X and "--runner X"
            if skip:
                skip = False
            elif arg == "--runner":
                skip = True
            elif not arg.startswith("--runner="):
                kept.append(arg)
        args = [f"--runner={LOCAL_RUNNER}", *kept]
        logging.info("Runner: the DirectRunner's in-process engine (%s)", LOCAL_RUNNER)
    return PipelineOptions(args)


def job_from_flags() -> BeamJob:
    """Validates the flags (the shared rules, `pretraining_cli`) into a BeamJob."""
    if FLAGS.pool_size_mb <= 0:
        raise cli.UserError(f"--pool_size_mb={FLAGS.pool_size_mb} must be positive")
    job = pretraining_cli.job_from_flags(FLAGS)
    return BeamJob(**{field.name: getattr(job, field.name)
                      for field in dataclasses.fields(job)},
                   pool_bytes=int(FLAGS.pool_size_mb * 1024 * 1024))


def main(argv):
    """The command (our flags parsed, Beam's options in argv): `work` in the shell."""
    return cli.run_main(lambda: _work(argv), "beam_pretraining_data")


def _work(argv) -> None:
    options = pipeline_options(argv[1:])
    job = job_from_flags()
    try:
        summary = run_job(job, options)
    except KeyboardInterrupt:
        print("beam_pretraining_data: interrupted; no output written (earlier outputs are "
              "unchanged)", file=sys.stderr, flush=True)
        raise
    pretraining_cli.log_summary(summary)
    logging.info("Summary written to %s", job.summary_path)


def run():
    """The command; our flags are parsed here, the rest (Beam's options) reach main()."""
    define_flags()
    cli.start(main, "beam_pretraining_data", known_only=True)


if __name__ == "__main__":
    # Through the importable module, so Beam pickles this module's DoFns by reference
    # (workers import data_prep.beam_pretraining_data) rather than from __main__.
    from data_prep import beam_pretraining_data

    beam_pretraining_data.run()
