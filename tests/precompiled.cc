// Compiled only for tests/precompiled.h, which every test binary reuses.
