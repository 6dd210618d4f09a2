"""OpenAI's embeddings API on `python -m stream gateway`, called by the ``openai`` SDK as its users call it, in
front of `python -m stream worker --model minilm` on Kafka: each text's embedding as the model computes it
directly, usage as the worker counted it, a wrong key refused, and a timeout answered without the SDK's retries
putting the texts on the topic again."""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
import tritonclient.http
import tritonclient.utils

from producers.texts import generate_texts
from stream.local.children import WorkerProcess
from stream.models.demo import TEXT_COPY_FIELDS, TEXT_EMBEDDING_SCHEMA, TEXT_EVENT_SCHEMA
from stream.models.minilm import PACKAGE, PACKAGE_ZIP, MiniLMHandler
from tests.gateway_cli import Gateway
from tests.integration.harness import Pipeline, wait_for_assignment
from tests.verify import end_offsets

pytestmark = pytest.mark.integration
MODEL = "all-MiniLM-L6-v2"


@pytest.fixture
def closing() -> Iterator[contextlib.ExitStack]:
    """The test's clients, closed after it; then a collection, so that a client's socket left to the collector
    fails this test's teardown (ResourceWarning) rather than whichever test the collector next runs in."""
    with contextlib.ExitStack() as stack:
        yield stack
    gc.collect()


def topic_size(pipeline: Pipeline) -> int:
    return sum(end_offsets(pipeline.bootstrap, pipeline.input).values())


def text_pipeline(pipeline: Pipeline, tmp_path: Path, key: str, timeout_ms: int, *worker_flags: str
                  ) -> tuple[WorkerProcess, Gateway]:
    """A `--model minilm` worker (the installed weights) and a gateway with ``key`` in front of it, both ready."""
    weights = importlib.metadata.distribution(PACKAGE).locate_file(PACKAGE_ZIP)  # the installed weights' zip
    worker = pipeline.worker("--model", "minilm", "--model-dir", str(weights),  # (after the harness's demo dir)
                             "--input-schema", TEXT_EVENT_SCHEMA, "--output-schema", TEXT_EMBEDDING_SCHEMA,
                             "--copy-fields", TEXT_COPY_FIELDS, "--max-wait-ms", "20", *worker_flags)
    gateway = Gateway(pipeline.bootstrap, pipeline.input, tmp_path / "gw.log", "--model", "minilm",
                      "--timeout-ms", str(timeout_ms), f"--api-key={key}", input_schema=TEXT_EVENT_SCHEMA, api_key=key)
    try:
        wait_for_assignment(worker)
        gateway.wait_ready()
    except BaseException:
        gateway.process.kill()
        raise
    return worker, gateway


def model_embeddings(count: int, seed: int) -> tuple[list[str], np.ndarray, MiniLMHandler]:
    """``count`` generated texts, their embeddings as the model computes them directly, and the model."""
    handler = MiniLMHandler()
    handler.load(torch.device("cpu"))
    texts = list(generate_texts(count, seed=seed).texts)
    return texts, np.asarray(handler.embed(texts)), handler


def test_the_openai_sdk_gets_the_model_s_embeddings_and_usage_and_no_retry_storm_after_a_timeout(
        pipeline: Pipeline, tmp_path: Path, closing: contextlib.ExitStack) -> None:
    key = secrets.token_urlsafe(24)
    worker, gateway = text_pipeline(pipeline, tmp_path, key, 8000, "--dlq-topic",
                                    pipeline.input.replace("-in-", "-dlq-"))
    try:
        texts, expected, handler = model_embeddings(12, seed=5)
        client = closing.enter_context(openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key))
        assert [m.id for m in client.models.list()] == [MODEL]
        one = client.embeddings.create(model=MODEL, input=texts[0])  # the SDK's default: base64, decoded by it
        assert np.asarray(one.data[0].embedding) == pytest.approx(expected[0], abs=1e-5)
        assert one.usage.prompt_tokens == len(handler.tokenize(texts[:1])[0])
        many = client.embeddings.create(model=MODEL, input=texts, encoding_format="float", dimensions=384)
        assert [d.index for d in many.data] == list(range(len(texts)))
        assert np.asarray([d.embedding for d in many.data]) == pytest.approx(expected, abs=1e-5)
        assert many.usage.prompt_tokens == many.usage.total_tokens == sum(len(t) for t in handler.tokenize(texts))
        # TEI's /embed on the same gateway.
        tei = httpx.post(f"{gateway.url}/embed", json={"inputs": texts[:3]}, timeout=30,
                         headers={"Authorization": f"Bearer {key}"})
        assert tei.status_code == 200 and np.asarray(tei.json()) == pytest.approx(expected[:3], abs=1e-5)
        # tritonclient on the same gateway: a BYTES tensor of texts, the embeddings as a matrix.
        triton = tritonclient.http.InferenceServerClient(url=f"127.0.0.1:{gateway.port}")
        given = tritonclient.http.InferInput("text", [len(texts)], "BYTES")
        given.set_data_from_numpy(np.asarray([t.encode() for t in texts], dtype=np.object_))
        result = triton.infer(MODEL, [given], headers={"Authorization": f"Bearer {key}"})
        assert result.as_numpy("embedding") == pytest.approx(expected, abs=1e-5)
        with pytest.raises(tritonclient.utils.InferenceServerException, match="API key"):
            triton.infer(MODEL, [given])
        triton.close()
        with pytest.raises(openai.BadRequestError, match="dimensions"):
            client.embeddings.create(model=MODEL, input="x", dimensions=128)
        with pytest.raises(openai.AuthenticationError):
            closing.enter_context(openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="not-" + key)
                                  ).embeddings.create(model=MODEL, input="x")
        # A worker that stopped answering (SIGSTOP: still in the group): the one text waits on the topic; the SDK
        # gets 504 and does not send it again.
        worker.proc.send_signal(signal.SIGSTOP)
        before = topic_size(pipeline)
        with pytest.raises(openai.APIStatusError) as late:
            client.embeddings.create(model=MODEL, input="nobody predicts this in time")
        assert late.value.status_code == 504 and "input[0]" in late.value.message
        assert topic_size(pipeline) == before + 1, "one event: the SDK's two retries were told not to"
        assert gateway.metric("stream_gateway_embeddings_requests_total", '{status="504"}') == 1
        worker.proc.send_signal(signal.SIGCONT)
        assert worker.terminate() == 0
        assert gateway.stop() == 0
    finally:
        worker.proc.send_signal(signal.SIGCONT)
        gateway.process.kill()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_langchain_haystack_and_kserve_s_sdk_work_unchanged_and_a_full_request_of_2048_texts_is_served(
        pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closing: contextlib.ExitStack
) -> None:
    """Each library as its documentation shows it, against the model run directly: LangChain's OpenAIEmbeddings
    embeds 1,000 documents in one request (its default chunk size), Haystack's OpenAI embedders, and KServe's
    REST client (server and model health, infer); then the OpenAI SDK's most texts in one request (2,048, the
    gateway's default --max-texts), the gateway's memory measured around it."""
    from haystack import Document
    from haystack.components.embedders import OpenAIDocumentEmbedder, OpenAITextEmbedder
    from haystack.utils import Secret
    from langchain_openai import OpenAIEmbeddings

    monkeypatch.setenv("HAYSTACK_TELEMETRY_ENABLED", "False")  # no posthog calls from this machine
    key = secrets.token_urlsafe(24)
    worker, gateway = text_pipeline(pipeline, tmp_path, key, 120_000, "--max-batch-size", "256")
    try:
        texts, expected, _ = model_embeddings(2048, seed=11)

        # LangChain: its documented OpenAI-compatible setup; check_embedding_ctx_length=False sends text, not
        # tiktoken's token ids (which the gateway refuses, naming this setting). Default chunk_size: 1,000.
        lc = OpenAIEmbeddings(model=MODEL, base_url=f"{gateway.url}/v1", api_key=key,
                              check_embedding_ctx_length=False, http_client=closing.enter_context(httpx.Client()))
        assert lc.chunk_size == 1000
        sent = topic_size(pipeline)
        got = np.asarray(lc.embed_documents(texts[:1000]))
        assert got == pytest.approx(expected[:1000], abs=1e-5)
        assert topic_size(pipeline) == sent + 1000
        assert np.asarray(lc.embed_query(texts[0])) == pytest.approx(expected[0], abs=1e-5)
        # What LangChain sends by default (tiktoken's token ids): a 400 naming the setting that fixes it.
        with pytest.raises(openai.BadRequestError, match="check_embedding_ctx_length=False"):
            closing.enter_context(openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key)
                                  ).embeddings.create(model=MODEL, input=[[101, 2023, 102]])

        # Haystack: its OpenAI embedders pointed at the gateway.
        secret = Secret.from_token(key)
        text_embedder = OpenAITextEmbedder(api_key=secret, model=MODEL, api_base_url=f"{gateway.url}/v1")
        one = text_embedder.run(texts[1])
        closing.enter_context(text_embedder.client)  # created by run(): its connections closed with the test
        assert np.asarray(one["embedding"]) == pytest.approx(expected[1], abs=1e-5)
        doc_embedder = OpenAIDocumentEmbedder(api_key=secret, model=MODEL, api_base_url=f"{gateway.url}/v1",
                                              batch_size=32, progress_bar=False)
        docs = doc_embedder.run(documents=[Document(content=t) for t in texts[:40]])["documents"]
        closing.enter_context(doc_embedder.client)
        assert np.asarray([d.embedding for d in docs]) == pytest.approx(expected[:40], abs=1e-5)

        # huggingface_hub as against text-embeddings-inference: the root URL, the key as its token.
        from huggingface_hub import InferenceClient

        hub = closing.enter_context(InferenceClient(model=gateway.url, token=key))
        assert np.asarray(hub.feature_extraction(texts[2])).reshape(-1) == pytest.approx(expected[2], abs=1e-5)

        # KServe's SDK: the Open Inference Protocol's health calls and a BYTES tensor of texts.
        kserve_checks(gateway.url, key, texts[:5], expected[:5])

        # The most texts one request may carry (--max-texts 2,048), as floats: the gateway's memory around it.
        client = closing.enter_context(openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, timeout=120))
        before = rss_mib(gateway.process.pid)
        full = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
        after = rss_mib(gateway.process.pid)
        assert np.asarray([d.embedding for d in full.data]) == pytest.approx(expected, abs=1e-5)
        print(f"gateway RSS around one request of {len(texts)} texts: {before:.0f} -> {after:.0f} MiB")
        assert after - before < 96, f"{before:.0f} -> {after:.0f} MiB"
        with pytest.raises(openai.BadRequestError, match="at most 2048"):
            client.embeddings.create(model=MODEL, input=[*texts, "one more"])
        assert worker.terminate() == 0
        assert gateway.stop() == 0
    finally:
        gateway.process.kill()


def kserve_checks(url: str, key: str, texts: list[str], expected: np.ndarray) -> None:
    import asyncio

    from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

    async def run() -> None:
        client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
        auth = {"Authorization": f"Bearer {key}"}
        try:
            assert await client.is_server_live(url, headers=auth) is True
            assert await client.is_server_ready(url, headers=auth) is True
            assert await client.is_model_ready(url, MODEL, headers=auth) is True
            given = InferInput("text", [len(texts)], "BYTES")
            given.set_data_from_numpy(np.asarray([t.encode() for t in texts], dtype=np.object_))
            result = await client.infer(url, InferRequest(MODEL, [given]), model_name=MODEL, headers=auth)
            [out] = [o for o in result.outputs if o.name == "embedding"]
            assert np.asarray(out.data, dtype=np.float32).reshape(len(texts), -1) == pytest.approx(expected,
                                                                                                    abs=1e-5)
        finally:
            await client.close()

    asyncio.run(run())
