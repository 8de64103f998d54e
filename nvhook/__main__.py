from nvhook.cli import main

raise SystemExit(main())
