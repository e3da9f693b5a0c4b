from hami_py.cli import main

raise SystemExit(main())
