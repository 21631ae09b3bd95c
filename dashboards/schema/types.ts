// The shapes of promreflex's dashboards in Grafana's own types (@grafana/schema, the version in
// package.json): the dashboard model Grafana's frontend types a dashboard with (`Dashboard`,
// schemaVersion 36 = Grafana 10.1), and for each panel type the dashboards use, the panel with
// that plugin's own options and field config, and Prometheus queries as targets.
//
// regenerate.py turns each exported type into a JSON schema (dashboards/schema/
// grafana-dashboard.schema.json, validated in Python by dashboards.schema.validate) and type-checks
// every generated dashboard against these types with tsc, so the two never disagree unnoticed.
// A panel type not listed here is an error: add its plugin's types when a dashboard uses one.
import type { AnnotationQuery, Dashboard, FieldConfigSource, Panel, RowPanel } from '@grafana/schema';
import type { PrometheusDataQuery } from '@grafana/schema/dist/esm/raw/composable/prometheus/dataquery/x/PrometheusDataQuery_types.gen';
import type { Options as StatOptions } from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';
import type {
  FieldConfig as StateTimelineFieldConfig,
  Options as StateTimelineOptions,
} from '@grafana/schema/dist/esm/raw/composable/statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen';
import type {
  FieldConfig as TimeSeriesFieldConfig,
  Options as TimeSeriesOptions,
} from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';

/** The dashboard without its panels (each is checked against its own type below). */
export interface PromreflexDashboard extends Omit<Dashboard, 'panels' | 'annotations' | 'schemaVersion'> {
  /** The schema version of Grafana 10.1, which the Foundation SDK writes. */
  schemaVersion: 36;
  annotations: { list: Array<AnnotationQuery<PrometheusDataQuery>> };
  panels: unknown[];
}

export interface StatPanel extends Omit<Panel<StatOptions>, 'type' | 'options' | 'targets'> {
  type: 'stat';
  options: StatOptions;
  targets: PrometheusDataQuery[];
}

export interface TimeSeriesPanel
  extends Omit<Panel<TimeSeriesOptions, TimeSeriesFieldConfig>, 'type' | 'options' | 'targets' | 'fieldConfig'> {
  type: 'timeseries';
  options: TimeSeriesOptions;
  fieldConfig: FieldConfigSource<TimeSeriesFieldConfig>;
  targets: PrometheusDataQuery[];
}

export interface StateTimelinePanel
  extends Omit<Panel<StateTimelineOptions, StateTimelineFieldConfig>, 'type' | 'options' | 'targets' | 'fieldConfig'> {
  type: 'state-timeline';
  options: StateTimelineOptions;
  fieldConfig: FieldConfigSource<StateTimelineFieldConfig>;
  targets: PrometheusDataQuery[];
}

/** A row; the panels of a collapsed row are checked one by one, like the dashboard's. */
export interface PromreflexRow extends Omit<RowPanel, 'type' | 'panels'> {
  type: 'row';
  panels: unknown[];
}

/**
 * T as it is written in JSON: TypeScript's string enums only accept their own members, JSON has
 * their values. tsc checks the dashboards as Json<PromreflexDashboard>, Json<StatPanel>, ...
 */
export type Json<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends Array<infer U>
      ? Array<Json<U>>
      : { [K in keyof T]: Json<T[K]> };
