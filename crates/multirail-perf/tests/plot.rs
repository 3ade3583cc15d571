//! Plots written to disk and read back: the SVG is well-formed XML with one
//! polyline per series and the series' names; the PNG has PNG's signature
//! and decodes to the canvas size.

use std::path::PathBuf;

use multirail_perf::Test;
use multirail_perf::report::plot::{self, Chart, Machine, PlotError, Series};

/// A scratch file in a directory of its own, both removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("multirail-plot-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir.join(name))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn machine() -> Machine {
    Machine { hostname: "node7".into(), cpus: 2 }
}

fn bw_chart() -> Chart {
    let sizes = [1u64, 1024, 65536, 1 << 20, 4 << 20];
    let series = |label: &str, scale: f64| Series {
        label: label.into(),
        points: sizes.iter().map(|&s| (s, scale * (s as f64).sqrt())).collect(),
    };
    Chart {
        test: Test::Bw,
        config: "compare: policy=*:single vs policy=*:adaptive & <friends>".into(),
        machine: machine(),
        series: vec![series("policy=*:single", 1.0), series("policy=*:adaptive", 1.8)],
        custom: None,
    }
}

fn texts(doc: &roxmltree::Document) -> Vec<String> {
    doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).map(|t| t.trim().into()).collect()
}

#[test]
fn svg_has_one_line_per_series_and_their_names() {
    let f = Scratch::new("bw.svg");
    plot::write(&f.0, &bw_chart()).unwrap();
    let text = std::fs::read_to_string(&f.0).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the SVG is well-formed XML");
    assert!(doc.root_element().has_tag_name("svg"));
    // Axes and ticks are 1-pixel black polylines; a series is a 2-pixel
    // coloured one through every measured size.
    let lines: Vec<roxmltree::Node> =
        doc.descendants().filter(|n| n.has_tag_name("polyline") && n.attribute("stroke-width") == Some("2")).collect();
    assert_eq!(lines.len(), 2, "one polyline per series");
    for l in &lines {
        assert_eq!(l.attribute("points").unwrap().split_whitespace().count(), 5);
    }
    assert_ne!(lines[0].attribute("stroke"), lines[1].attribute("stroke"));
    let circles = doc.descendants().filter(|n| n.has_tag_name("circle")).count();
    assert_eq!(circles, 10, "a marker per measured size");
    let t = texts(&doc);
    for want in [
        "policy=*:single",
        "policy=*:adaptive",
        "multirail bench bw: Bandwidth Test on node7 (2 CPUs)",
        "compare: policy=*:single vs policy=*:adaptive & <friends>",
        "Message size (bytes)",
        "Bandwidth (MB/s, MB = 10^6 bytes)",
        "1",
        "1K",
        "1M",
        "4M",
    ] {
        assert!(t.iter().any(|x| x == want), "no text {want:?} in {t:?}");
    }
}

#[test]
fn png_is_a_decodable_png() {
    let f = Scratch::new("lat.png");
    let chart = Chart {
        test: Test::Latency,
        config: "rails tcp:127.0.0.1,tcp:127.0.0.2  policy 16K:spread,*:adaptive".into(),
        machine: machine(),
        series: vec![Series {
            label: "2 rails".into(),
            points: vec![(0, 3.0), (1, 3.1), (8192, 9.0), (4 << 20, 900.0)],
        }],
        custom: None,
    };
    plot::write(&f.0, &chart).unwrap();
    let bytes = std::fs::read(&f.0).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes)).read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1024, 640));
    // Not a blank canvas: the title, axes and line left dark pixels.
    let dark = buf.chunks(info.line_size / info.width as usize).filter(|px| px.iter().take(3).all(|c| *c < 100));
    assert!(dark.count() > 1000);
}

#[test]
fn latency_svg_leaves_out_size_zero() {
    let chart = Chart {
        test: Test::Latency,
        config: "one rail".into(),
        machine: machine(),
        series: vec![Series { label: "one rail".into(), points: vec![(0, 2.0), (2, 2.5), (1024, 4.0)] }],
        custom: None,
    };
    let svg = plot::svg(&chart).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    assert_eq!(doc.descendants().filter(|n| n.has_tag_name("circle")).count(), 2);
    let t = texts(&doc);
    assert!(t.iter().any(|x| x == "Latency (µs, one way)"), "{t:?}");
}

#[test]
fn bad_targets_are_refused_before_drawing() {
    let chart = bw_chart();
    let e = plot::write(std::path::Path::new("/tmp/plot.jpg"), &chart).unwrap_err();
    assert_eq!(e, PlotError::UnknownFormat("/tmp/plot.jpg".into()));
    let e = plot::write(std::path::Path::new("/no/such/dir/plot.svg"), &chart).unwrap_err();
    assert!(matches!(e, PlotError::NoDirectory { .. }), "{e}");
    let empty = Chart { series: vec![Series { label: "x".into(), points: vec![(0, 1.0)] }], ..chart };
    assert_eq!(plot::svg(&empty), Err(PlotError::NoPoints));
}

#[test]
fn custom_axis_sets_title_label_and_log_scale() {
    let chart = Chart {
        test: Test::Bw,
        config: "intra shm vs inter tcp".into(),
        machine: machine(),
        series: vec![Series { label: "CBR-Bandwidth".into(), points: vec![(1, 0.05), (1024, 1.0), (1 << 20, 20.0)] }],
        custom: Some(plot::CustomAxis {
            what: "bench cbr: Communication Balance Ratios".into(),
            y_label: "CBR (intra / inter)".into(),
            log_y: true,
        }),
    };
    let svg = plot::svg(&chart).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let t = texts(&doc);
    for want in
        ["multirail bench cbr: Communication Balance Ratios on node7 (2 CPUs)", "CBR (intra / inter)", "0.01", "100"]
    {
        assert!(t.iter().any(|x| x == want), "no text {want:?} in {t:?}");
    }
}
