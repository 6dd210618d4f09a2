import signal

# Remember SIGTERM/SIGINT from the first line on; `stream.cli` turns them into a graceful stop.
EARLY_SIGNALS: list[int] = []
signal.signal(signal.SIGTERM, lambda signum, _frame: EARLY_SIGNALS.append(signum))
signal.signal(signal.SIGINT, lambda signum, _frame: EARLY_SIGNALS.append(signum))

from stream.cli import main  # noqa: E402

raise SystemExit(main(early_signals=EARLY_SIGNALS))
