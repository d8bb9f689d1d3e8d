"""routerd's rerank (pure): the request checked, the documents ordered by
the cosine of their embeddings with the query's, in llama-server's shape."""

import asyncio
import json
from typing import Any

import pytest

from syntrop.routerd import rerank
from syntrop.routerd.api import Response


def test_cosine_and_rank_order_best_first_ties_in_document_order() -> None:
    assert rerank.cosine([1.0, 0.0], [2.0, 0.0]) == pytest.approx(1.0)
    assert rerank.cosine([1.0, 0.0], [0.0, 3.0]) == pytest.approx(0.0)
    assert rerank.cosine([0.0, 0.0], [1.0, 1.0]) == 0.0
    query = [1.0, 0.0]
    ranked = rerank.rank([query, [0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [2.0, 2.0]], top_n=3)
    assert [index for index, _ in ranked] == [2, 1, 3]
    assert [score for _, score in ranked] == pytest.approx([1.0, 0.5 ** 0.5, 0.5 ** 0.5])


def _embeddings(vectors: list[list[float]]) -> Response:
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    data.reverse()  # the order of data is its index's, not the list's
    return Response(200, json.dumps({"object": "list", "model": "m", "data": data,
                                     "usage": {"prompt_tokens": 9, "total_tokens": 9}}).encode())


def test_a_request_is_ranked_with_documents_returned() -> None:
    sent: list[dict[str, Any]] = []

    async def embed(body: bytes) -> Response:
        sent.append(json.loads(body))
        return _embeddings([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1]])

    response = asyncio.run(rerank.rerank("POST", json.dumps(
        {"model": "m", "query": "q", "documents": ["far", "near"], "top_n": 1,
         "return_documents": True}).encode(), embed))
    assert sent == [{"model": "m", "input": ["q", "far", "near"]}]
    answer = json.loads(response.body)
    assert answer["model"] == "m (embedding cosine)"
    assert answer["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    assert [(r["index"], r["document"]["text"]) for r in answer["results"]] == [(1, "near")]


@pytest.mark.parametrize(("body", "param"), [
    ({"documents": ["a"]}, "query"),
    ({"query": "q"}, "documents"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": ["a", 3]}, "documents"),
    ({"query": "q", "documents": ["a"] * (rerank.MAX_DOCUMENTS + 1)}, "documents"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "return_documents"),
])
def test_bad_requests_are_400s_naming_the_field(body: dict[str, Any], param: str) -> None:
    async def embed(body: bytes) -> Response:
        raise AssertionError("a bad request is never embedded")

    response = asyncio.run(rerank.rerank("POST", json.dumps(body).encode(), embed))
    assert response.status == 400
    assert json.loads(response.body)["error"]["param"] == param


def test_the_embeddings_failure_is_the_answer() -> None:
    async def embed(body: bytes) -> Response:
        return Response(404, b'{"error": {"message": "no model"}}')

    response = asyncio.run(rerank.rerank("POST", b'{"query": "q", "documents": ["a"]}', embed))
    assert response.status == 404
    assert asyncio.run(rerank.rerank("GET", b"", embed)).status == 405


def test_the_most_documents_fit_one_embeddings_request_and_one_more_is_a_400() -> None:
    """The query and the documents are embedded in one request, within
    runtimed's 256 inputs: 255 documents are, 256 are refused naming it."""
    sent: list[int] = []

    async def embed(body: bytes) -> Response:
        inputs = json.loads(body)["input"]
        sent.append(len(inputs))
        return _embeddings([[1.0, float(i)] for i in range(len(inputs))])

    def ask(count: int) -> Response:
        return asyncio.run(rerank.rerank("POST", json.dumps(
            {"query": "q", "documents": ["d"] * count}).encode(), embed))

    assert rerank.MAX_INPUTS == 256
    assert ask(255).status == 200 and sent == [256]
    refused = ask(256)
    assert refused.status == 400 and sent == [256]
    message = json.loads(refused.body)["error"]["message"]
    assert "at most 255" in message and "256 inputs" in message
