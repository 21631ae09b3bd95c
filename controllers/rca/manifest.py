"""Root-cause analysis' manifest: ``promreflex rca``, the ``mesh-rca`` controller route, and the
Alertmanager inhibit rule that mutes the symptoms a root cause explains. It reads the mesh
capability's recorded series (rules/mesh.rules.yml)."""

from promreflex.capability import Capability, lazy

CAPABILITY = Capability(
    name="rca",
    summary="name the slow service whose own dependencies are healthy (mesh root cause)",
    cli=(lazy("controllers.rca.cli:register"),),
    routes=(
        # Mesh root cause: on slow services, name the one whose own dependencies are healthy.
        {"name": "mesh-rca", "matchers": ['alertname="ServiceResponseTimeHigh"'], "action": "rca",
         "params": {"report": ".promreflex/rca/latest.json"}},
    ),
    # The rca action posts MeshRootCauseSymptom{service=<dependant>} for each service a root
    # cause explains: mute that service's own response-time alert meanwhile.
    inhibit_rules=({"source_matchers": ['alertname="MeshRootCauseSymptom"'],
                    "target_matchers": ['alertname="ServiceResponseTimeHigh"'], "equal": ["service"]},),
)
