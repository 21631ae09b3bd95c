"""A fleet of shop hosts on one machine (network namespaces), with host agents and an HA
Prometheus pair and Alertmanager cluster: ``promreflex fleet up N``. See :mod:`controllers.fleet.lab`."""
