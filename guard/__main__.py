from guard.cli import main

raise SystemExit(main())
