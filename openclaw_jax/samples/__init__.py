"""Training samples and where they live: the one meeting point of the serving side and the trainer.

Modules: ``sample`` (:class:`Sample`, one scored turn, and its JSON encoding), ``person`` (person
ids: whose turn a sample is, ``DEFAULT_PERSON`` when nobody was named), ``store`` (the
durable append-only :class:`SampleStore`: the gateway and the agentic runner write it), ``tail``
(:class:`SampleTail`, the trainer's incremental reader), ``source`` (a grain data source over a
fixed range, for notebooks and offline pipelines). Imports nothing else of ours.
"""

from openclaw_jax.samples.sample import (SAMPLE_FORMAT_VERSION, SAMPLE_KINDS, Sample, SampleError, SampleSpec,
                                         decode_sample, encode_sample)
from openclaw_jax.samples.source import SampleStoreDataSource
from openclaw_jax.samples.store import SampleStore, SampleStoreError, SampleStoreLockedError
from openclaw_jax.samples.tail import SampleTail

__all__ = ["SAMPLE_FORMAT_VERSION", "SAMPLE_KINDS", "Sample", "SampleError", "SampleSpec", "SampleStore", "SampleStoreDataSource",
           "SampleStoreError", "SampleStoreLockedError", "SampleTail", "decode_sample", "encode_sample"]
