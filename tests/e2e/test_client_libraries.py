"""The clients users already run against TEI, pointed at us: openai's Python SDK on
/v1/embeddings and huggingface_hub's InferenceClient on TEI's `/` route, both against the
real all-MiniLM-L6-v2 served over loopback HTTP, their vectors against `tei_runtime` in-process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError

import tei_runtime
from support.loopback_server import Running, start

pytestmark = pytest.mark.slow

TEXTS = ["What is Deep Learning?", "Paris is the capital of France. " * 40, "a", "Grüß Gott 👋"]


@pytest.fixture(scope="module")
def served(minilm_artifact: Path) -> Iterator[Running]:
    r = start(tei_runtime.load(minilm_artifact), api_key="secret")
    yield r
    r.stop()


def test_openai_sdk(served: Running) -> None:
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="secret", max_retries=0)
    want = served.model.embed(TEXTS)
    # Without encoding_format the SDK asks for base64 and decodes it itself.
    got = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)
    assert [d.index for d in got.data] == [0, 1, 2, 3]
    np.testing.assert_array_equal(np.array([d.embedding for d in got.data], np.float32), want)
    lengths = [len(e) for e in served.model.encode(TEXTS)]
    assert got.usage.prompt_tokens == got.usage.total_tokens == sum(lengths)
    short = client.embeddings.create(model="all-MiniLM-L6-v2", input="a", dimensions=64,
                                     encoding_format="float")  # fmt: skip
    cut = served.model.embed(["a"], dimensions=64)[0]
    # float32's shortest digits read back as the same float32
    np.testing.assert_array_equal(np.asarray(short.data[0].embedding, np.float32), cut)
    with pytest.raises(openai.BadRequestError) as empty:
        client.embeddings.create(model="all-MiniLM-L6-v2", input=[])
    assert "cannot be empty" in str(empty.value)
    wrong = openai.OpenAI(base_url=f"{served.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.embeddings.create(model="all-MiniLM-L6-v2", input="a")


def test_huggingface_hub_inference_client(served: Running) -> None:
    client = InferenceClient(model=served.url, token="secret")
    got = client.feature_extraction(TEXTS[0])
    np.testing.assert_array_equal(np.asarray(got, np.float32), served.model.embed(TEXTS[:1]))
    raw = client.feature_extraction(TEXTS[1], normalize=False, truncate=True)
    np.testing.assert_array_equal(
        np.asarray(raw, np.float32), served.model.embed(TEXTS[1:2], normalize=False)
    )
    with pytest.raises(HfHubHTTPError) as refused:
        InferenceClient(model=served.url, token="nope").feature_extraction("a")
    assert refused.value.response is not None and refused.value.response.status_code == 401
