"""`runtimed verify MODEL_PATH`: check llama.cpp's logits on a model file
against the numpy oracle; exit 0 when they agree, 1 when they do not, 2 when
the file cannot be checked."""

import argparse
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="runtimed verify",
        description="Check llama.cpp's logits on a llama-architecture GGUF file against "
                    "a numpy forward pass (see syntrop.runtimed.oracle).")
    parser.add_argument("model", type=Path, help="the GGUF file")
    parser.add_argument("--tokens", type=int, default=16, metavar="N",
                        help="check the first N tokens of a fixed text (default 16)")
    parser.add_argument("--all-tokens", action="store_true",
                        help="check a sequence of every token id of the vocabulary "
                             "(small vocabularies only)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="largest relative error allowed (default: calibrated)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per position")
    args = parser.parse_args(argv)
    if args.tokens < 1:
        parser.error("--tokens must be at least 1")
    if not args.model.is_file():
        print(f"runtimed verify: {args.model}: no such file", file=sys.stderr)
        return 2
    from syntrop.runtimed.oracle.compare import format_report, verify
    from syntrop.runtimed.oracle.weights import OracleError, Weights

    try:
        tokens = None
        if args.all_tokens:
            n_vocab = Weights(args.model).config.n_vocab
            if n_vocab > 4096:
                print(f"runtimed verify: {n_vocab} tokens is too many for --all-tokens",
                      file=sys.stderr)
                return 2
            tokens = list(range(n_vocab))
        report = verify(args.model, tokens, count=args.tokens, tolerance=args.tolerance,
                        threads=args.threads)
    except (OracleError, ValueError) as error:
        print(f"runtimed verify: {args.model}: {error}", file=sys.stderr)
        return 2
    print(format_report(report, verbose=args.verbose))
    return 0 if report.ok else 1
