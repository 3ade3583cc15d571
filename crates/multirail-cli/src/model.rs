//! `multirail model`: the NPC'09 multi-rail bandwidth predictions from
//! given rates (the arithmetic lives in `multirail_perf::model`).

use anyhow::Context;
use multirail_perf::model::{self, ModelInput, ModelReport};

use crate::cli::ModelArgs;

pub fn run(args: &ModelArgs) -> anyhow::Result<()> {
    let input = input_of(args)?;
    if args.json {
        print!("{}", ModelReport::new(&input).json());
    } else {
        print!("{}", input.explain());
    }
    Ok(())
}

fn input_of(args: &ModelArgs) -> anyhow::Result<ModelInput> {
    let links = parse_links(&args.link).context("--link")?;
    let rails = match args.rails {
        Some(n) => n,
        None if links.len() > 1 => links.len(),
        None => anyhow::bail!("--rails N is needed with a single --link rate (or give one rate per rail)"),
    };
    let nic = parse_opt(args.nic.as_deref()).context("--nic")?;
    let host = parse_opt(args.host.as_deref()).context("--host")?;
    ModelInput::new(rails, &links, nic, host).context("--rails/--link")
}

/// `2gbit` or `1gbit,3gbit`, in bytes/s.
pub fn parse_links(s: &str) -> anyhow::Result<Vec<f64>> {
    Ok(s.split(',').map(model::parse_rate).collect::<Result<_, _>>()?)
}

/// An optional rate, in bytes/s.
pub fn parse_opt(s: Option<&str>) -> anyhow::Result<Option<f64>> {
    Ok(s.map(model::parse_rate).transpose()?)
}
