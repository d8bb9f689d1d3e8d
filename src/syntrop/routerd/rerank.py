"""POST /v1/rerank (and /rerank): documents ordered by relevance to a query,
in llama-server's shape.

    {"model": "smollm2", "query": "...", "documents": ["...", ...], "top_n": 3}
    → {"model": "smollm2 (embedding cosine)", "object": "list",
       "usage": {"prompt_tokens": N, "total_tokens": N},
       "results": [{"index": 2, "relevance_score": 0.83}, ...]}

No reranker model installs offline here, so the score is the cosine
similarity of the query's and each document's embeddings, taken from the
model named (through /v1/embeddings: the same providers, limits and
failover), and the reply's model says so. `return_documents: true` adds each
document's text. Results are sorted by score, highest first; `top_n` keeps
that many (default: all).
"""

import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

from syntrop.routerd.api import BadRequest, Response, error, ok, parse

#: Most inputs one embeddings request may carry: runtimed's Embed limit
#: (its MAX_INPUTS; a daemon imports no other daemon).
MAX_INPUTS = 256
#: Most documents one request may rank: they and the query are embedded in
#: one request, so that one model embeds them all.
MAX_DOCUMENTS = MAX_INPUTS - 1
SCORING = "embedding cosine"

Embed = Callable[[bytes], Awaitable[Response]]


def _request(body: bytes) -> tuple[dict[str, Any], str, list[str], int, bool]:
    request = parse(body)
    if not isinstance(request, dict):
        raise BadRequest("the request body must be a JSON object")
    query = request.get("query")
    if not isinstance(query, str) or not query:
        raise BadRequest("query: a non-empty string", "query")
    documents = request.get("documents")
    if not isinstance(documents, list) or not documents or \
            not all(isinstance(d, str) and d for d in documents):
        raise BadRequest("documents: a non-empty list of non-empty strings", "documents")
    if len(documents) > MAX_DOCUMENTS:
        raise BadRequest(f"documents: at most {MAX_DOCUMENTS} (with the query, the "
                         f"{MAX_INPUTS} inputs one embeddings request may carry)", "documents")
    top_n = request.get("top_n", len(documents))
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1:
        raise BadRequest("top_n: an integer >= 1", "top_n")
    back = request.get("return_documents", False)
    if not isinstance(back, bool):
        raise BadRequest("return_documents: true or false", "return_documents")
    return request, query, documents, top_n, back


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def rank(vectors: list[list[float]], top_n: int) -> list[tuple[int, float]]:
    """(document index, score) for the query (vectors[0]) against each
    document (vectors[1:]), best first; ties keep the documents' order."""
    query, documents = vectors[0], vectors[1:]
    scored = [(index, cosine(query, vector)) for index, vector in enumerate(documents)]
    scored.sort(key=lambda pair: -pair[1])
    return scored[:top_n]


async def rerank(method: str, body: bytes, embed: Embed) -> Response:
    """`embed` answers an embeddings request as /v1/embeddings would."""
    if method != "POST":
        return error(405, "use POST")
    try:
        request, query, documents, top_n, back = _request(body)
    except BadRequest as bad:
        return error(400, str(bad), bad.code, bad.param)
    asked: dict[str, Any] = {"input": [query, *documents]}
    if request.get("model") is not None:
        asked["model"] = request["model"]
    response = await embed(json.dumps(asked).encode())
    if response.status != 200:
        return response
    answer = json.loads(response.body)
    vectors = [item["embedding"] for item in sorted(answer["data"], key=lambda d: d["index"])]
    results = []
    for index, score in rank(vectors, top_n):
        result: dict[str, Any] = {"index": index, "relevance_score": score}
        if back:
            result["document"] = {"text": documents[index]}
        results.append(result)
    usage = answer.get("usage") or {}
    return ok({"model": f"{answer.get('model') or asked.get('model', '')} ({SCORING})",
               "object": "list",
               "usage": {"prompt_tokens": usage.get("prompt_tokens", 0),
                         "total_tokens": usage.get("total_tokens", 0)},
               "results": results})
