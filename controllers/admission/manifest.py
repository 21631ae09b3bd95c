"""Session admission's manifest (seed 002): ``promreflex admission proxy|keygen``, the
``admission:`` configuration section, its rules and dashboard.

No process in the local stack and no default route: the proxy belongs in front of *your* app
(``stack.upstream`` points nginx at it; ``stack.extra_scrape`` adds its job ``admission``), and the
``admission`` action needs a route naming the proxy and what to tighten (README "Session
admission").
"""

from controllers.admission.config import AdmissionSection
from promreflex.capability import Capability, lazy

CAPABILITY = Capability(
    name="admission",
    summary="admission proxy: a concurrency limit per page class and new sessions admitted one per interval",
    cli=(lazy("controllers.admission.cli:register"),),
    config_section="admission",
    config_model=AdmissionSection,
    rules=("admission.rules.yml",),
    dashboards=("admission.json",),
    # The proxy's control listener (admission.control.listen_address), as the rules and the
    # dashboard select it: job `admission`. 15 s is what the rules' tests run at (any interval
    # from 200 ms to 60 s works).
    user_scrape_jobs=({"job_name": "admission", "scrape_interval": "15s",
                       "static_configs": [{"targets": ["127.0.0.1:9188"]}]},),
)
