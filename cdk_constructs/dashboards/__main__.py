"""Rewrites the checked-in Grafana dashboard from the panel definitions."""

from cdk_constructs.dashboards import GRAFANA_FILE, grafana_json

GRAFANA_FILE.write_text(grafana_json())
print(f"wrote {GRAFANA_FILE}")
