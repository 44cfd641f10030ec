"""Campaigns: a set of live runs (a base config and the axes to vary) run one after another into one
folder, resumable, on loopback, the emulated fleet or a fleet of service agents such as Raspberry Pis
(`flexfl campaign run`; docs/campaigns.md).

Modules: `spec` reads a campaign file into its runs, `runner` runs them and knows where each stands,
`cli` is the command; the folder's index and page are flexfl.campaign_index's (flexfl report reads them too).
"""
