from producers.cli import main

raise SystemExit(main())
