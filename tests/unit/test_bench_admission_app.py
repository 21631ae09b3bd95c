"""The bench app's inline pages: the overhead step's control without the process pool's hop."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import aiohttp

from bench.admission.app import AppState, build
from bench.admission.pages import PAGE_CLASSES, PAGES
from promreflex.httpd import ADDRESSES, serving


class CountingPool(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.submitted = 0

    def submit(self, *a, **kw):  # type: ignore[no-untyped-def, override]
        self.submitted += 1
        return super().submit(*a, **kw)


async def _get(state: AppState, path: str) -> int:
    async with serving("127.0.0.1:0", build(state)) as site:
        url = f"http://127.0.0.1:{site[ADDRESSES][0][1]}{path}"
        async with aiohttp.ClientSession() as c, c.get(url) as resp:
            await resp.read()
            return resp.status


def _state(inline: bool, pool: CountingPool) -> AppState:
    return AppState(iterations={n: 1 for n in PAGE_CLASSES}, cost_ms={n: 0.0 for n in PAGE_CLASSES}, pool=pool,  # type: ignore[arg-type]
                    workers=1, inline=inline)


async def test_inline_pages_skip_the_pool_only_when_the_app_does_no_work_and_asked() -> None:
    page = PAGES[1]
    with CountingPool() as pool:
        st = _state(True, pool)
        assert await _get(st, page.path + "?inline=1") == 200
        assert pool.submitted == 0 and st.pages[page.name].served == 1
        assert await _get(st, page.path) == 200  # not asked: through the pool as always
        assert pool.submitted == 1
        off = _state(False, pool)  # an app doing page work never answers inline
        assert await _get(off, page.path + "?inline=1") == 200
        assert pool.submitted == 2 and off.pages[page.name].served == 1
