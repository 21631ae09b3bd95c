"""Root-cause analysis: which slow service is the cause, and why.

Pure decision logic (:func:`analyse`) over typed inputs, fed by interchangeable sources: a
folder of MicroRCA-style CSVs (:mod:`controllers.rca.offline`) or a Prometheus server
(:mod:`controllers.rca.promsource`). After Nishi, Ohno and Kushida, "Identifying the cause of
response-time increases in microservice applications": learn who calls whom from sidecar
logs, take services slower than 3 s as candidates, blame the candidate whose slowness is not
explained by a slow dependency, and rank by resource usage (with disk I/O, their future work).
"""

from controllers.rca.engine import analyse
from controllers.rca.models import (
    AnalysisConfig,
    AnalysisInput,
    Finding,
    LatencyStats,
    ResourceEvidence,
    ServiceData,
    ServiceVerdict,
    TimeSeries,
)

__all__ = [
    "AnalysisConfig",
    "AnalysisInput",
    "Finding",
    "LatencyStats",
    "ResourceEvidence",
    "ServiceData",
    "ServiceVerdict",
    "TimeSeries",
    "analyse",
]
