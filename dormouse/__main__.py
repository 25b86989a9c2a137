from dormouse.cli import main

raise SystemExit(main())
