from stream.cli import main

raise SystemExit(main())
