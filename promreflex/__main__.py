from promreflex.cli import main

raise SystemExit(main())
