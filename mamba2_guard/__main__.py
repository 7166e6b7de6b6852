from mamba2_guard.cli import main

raise SystemExit(main())
