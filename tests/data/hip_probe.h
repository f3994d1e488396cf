// The engine probe header the fake HIP kind of tests/hip_kind.py names (EngineProbe.header): the fake project's
// build checks that it is there and the build key hashes it; the fake engine compiles nothing of it. A real HIP
// kind's header defines harness_probe_page_locked with hipPointerGetAttributes (docs/layout.md, "Adding a
// platform kind").
#pragma once
