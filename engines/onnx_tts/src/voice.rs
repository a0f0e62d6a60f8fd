//! A Piper voice's configuration: the `<voice>.onnx.json` beside the model.
//!
//! Only what synthesis needs is read: the sample rate, how text becomes phonemes (espeak-ng
//! voice or raw codepoints), the phoneme → id map, the inference scales and the speakers.

use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Piper's special symbols: padding after every phoneme, beginning and end of a sentence.
const PAD: &str = "_";
const BOS: &str = "^";
const EOS: &str = "$";

/// How the voice's text turns into phonemes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhonemeType {
    /// IPA from espeak-ng (almost every Piper voice).
    Espeak,
    /// The text's own codepoints (NFD), for voices trained on characters.
    Text,
}

#[derive(Clone, Debug)]
pub struct VoiceConfig {
    /// The name a request may give for a single-speaker voice (the dataset, else the file stem).
    pub name: String,
    pub sample_rate: u32,
    pub espeak_voice: String,
    pub phoneme_type: PhonemeType,
    pub phoneme_id_map: HashMap<String, Vec<i64>>,
    pub noise_scale: f32,
    pub length_scale: f32,
    pub noise_w: f32,
    pub num_speakers: u32,
    /// Speaker names in id order; the default speaker first.
    pub speakers: Vec<(String, i64)>,
    pub default_speaker: i64,
    /// Phoneme sequences the voice was trained to read as one symbol (e.g. `a`,`ɪ` → `aɪ`).
    pub vowel_clusters: Vec<Vec<String>>,
    pub language: Option<String>,
}

#[derive(Deserialize)]
struct RawConfig {
    audio: RawAudio,
    #[serde(default)]
    espeak: Option<RawEspeak>,
    #[serde(default)]
    phoneme_type: Option<String>,
    phoneme_id_map: HashMap<String, Vec<i64>>,
    #[serde(default)]
    inference: RawInference,
    #[serde(default)]
    num_speakers: Option<u32>,
    #[serde(default)]
    speaker_id_map: HashMap<String, i64>,
    #[serde(default)]
    default_speaker_id: Option<i64>,
    #[serde(default)]
    vowel_clusters: Vec<Vec<String>>,
    #[serde(default)]
    dataset: Option<String>,
    #[serde(default)]
    language: Option<RawLanguage>,
}

#[derive(Deserialize)]
struct RawAudio {
    sample_rate: u32,
}

#[derive(Deserialize)]
struct RawEspeak {
    voice: String,
}

#[derive(Deserialize)]
struct RawLanguage {
    #[serde(default)]
    family: Option<String>,
}

/// Piper's defaults for voices that leave a scale out.
#[derive(Deserialize)]
struct RawInference {
    #[serde(default = "default_noise_scale")]
    noise_scale: f32,
    #[serde(default = "default_length_scale")]
    length_scale: f32,
    #[serde(default = "default_noise_w")]
    noise_w: f32,
}

impl Default for RawInference {
    fn default() -> Self {
        Self { noise_scale: default_noise_scale(), length_scale: default_length_scale(), noise_w: default_noise_w() }
    }
}

fn default_noise_scale() -> f32 {
    0.667
}
fn default_length_scale() -> f32 {
    1.0
}
fn default_noise_w() -> f32 {
    0.8
}

/// `<model>.onnx.json`, the config Piper keeps beside every voice model.
pub fn config_path(model: &Path) -> PathBuf {
    let mut name = model.as_os_str().to_owned();
    name.push(".json");
    PathBuf::from(name)
}

impl VoiceConfig {
    /// Reads the config beside `model`; the error says which file and what is wrong with it.
    pub fn load(model: &Path) -> Result<Self, String> {
        let path = config_path(model);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "cannot read the voice config {} (a Piper voice is <voice>.onnx plus <voice>.onnx.json): {e}",
                path.display()
            )
        })?;
        let stem = model.file_stem().and_then(|s| s.to_str()).unwrap_or("default");
        Self::parse(&text, stem).map_err(|e| format!("bad voice config {}: {e}", path.display()))
    }

    pub fn parse(text: &str, stem: &str) -> Result<Self, String> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let phoneme_type = match raw.phoneme_type.as_deref() {
            None | Some("espeak") => PhonemeType::Espeak,
            Some("text") => PhonemeType::Text,
            Some(other) => {
                return Err(format!(
                    "phoneme_type {other:?} is not supported (this engine reads \"espeak\" and \"text\")"
                ))
            }
        };
        let espeak_voice = match (&raw.espeak, phoneme_type) {
            (Some(e), _) if !e.voice.is_empty() => e.voice.clone(),
            (_, PhonemeType::Text) => String::new(),
            _ => return Err("espeak.voice is missing".into()),
        };
        if raw.audio.sample_rate == 0 {
            return Err("audio.sample_rate is 0".into());
        }
        for symbol in [PAD, BOS, EOS] {
            if raw.phoneme_id_map.get(symbol).is_none_or(|ids| ids.is_empty()) {
                return Err(format!("phoneme_id_map has no id for {symbol:?}"));
            }
        }
        let num_speakers = raw.num_speakers.unwrap_or(1).max(1);
        let mut speakers: Vec<(String, i64)> = if raw.speaker_id_map.is_empty() && num_speakers > 1 {
            // Unnamed speakers are asked for by number.
            (0..num_speakers as i64).map(|i| (i.to_string(), i)).collect()
        } else {
            raw.speaker_id_map.into_iter().collect()
        };
        speakers.sort_by_key(|&(_, id)| id);
        if let Some((name, id)) = speakers.iter().find(|&&(_, id)| id < 0 || id >= num_speakers as i64) {
            return Err(format!("speaker {name:?} has id {id}, outside 0..{num_speakers}"));
        }
        let default_speaker = raw.default_speaker_id.unwrap_or(0);
        if num_speakers > 1 {
            if default_speaker < 0 || default_speaker >= num_speakers as i64 {
                return Err(format!("default_speaker_id {default_speaker} is outside 0..{num_speakers}"));
            }
            if let Some(i) = speakers.iter().position(|&(_, id)| id == default_speaker) {
                let default = speakers.remove(i);
                speakers.insert(0, default);
            }
        }
        Ok(VoiceConfig {
            name: raw.dataset.filter(|d| !d.is_empty()).unwrap_or_else(|| stem.to_string()),
            sample_rate: raw.audio.sample_rate,
            espeak_voice,
            phoneme_type,
            phoneme_id_map: raw.phoneme_id_map,
            noise_scale: raw.inference.noise_scale,
            length_scale: raw.inference.length_scale,
            noise_w: raw.inference.noise_w,
            num_speakers,
            speakers,
            default_speaker,
            vowel_clusters: raw.vowel_clusters.into_iter().filter(|c| c.len() > 1).collect(),
            language: raw.language.and_then(|l| l.family),
        })
    }

    /// The names a request may give as `voice`, the default first.
    pub fn voice_names(&self) -> Vec<String> {
        if self.num_speakers > 1 {
            self.speakers.iter().map(|(n, _)| n.clone()).collect()
        } else {
            vec![self.name.clone()]
        }
    }

    /// The `sid` input for a request's `voice`: `None` for single-speaker voices. A name the voice
    /// does not have is an error that lists the ones it has.
    pub fn speaker_id(&self, voice: Option<&str>) -> Result<Option<i64>, String> {
        let voice = voice.map(str::trim).filter(|v| !v.is_empty());
        if self.num_speakers <= 1 {
            return match voice {
                None => Ok(None),
                Some(v) if v == self.name => Ok(None),
                Some(v) => Err(format!("voice {v:?} is not a voice of this model (it has one: {:?})", self.name)),
            };
        }
        match voice {
            None => Ok(Some(self.default_speaker)),
            Some(v) => match self.speakers.iter().find(|(name, _)| name == v) {
                Some(&(_, id)) => Ok(Some(id)),
                None => {
                    let names: Vec<&str> = self.speakers.iter().take(20).map(|(n, _)| n.as_str()).collect();
                    let more = if self.speakers.len() > names.len() { ", ..." } else { "" };
                    Err(format!("voice {v:?} is not a speaker of this model (it has: {}{more})", names.join(", ")))
                }
            },
        }
    }

    /// Piper's id sequence for one sentence: BOS, pad, then each phoneme's ids followed by the
    /// pad, then EOS. Phonemes the voice does not know are left out and returned, as Piper does.
    pub fn phoneme_ids(&self, phonemes: &[String]) -> (Vec<i64>, Vec<String>) {
        let map = &self.phoneme_id_map;
        let pad = &map[PAD];
        let mut ids = Vec::with_capacity(phonemes.len() * 2 + 3);
        ids.extend(&map[BOS]);
        ids.extend(pad);
        let mut missing = Vec::new();
        for p in phonemes {
            match map.get(p) {
                Some(p_ids) => {
                    ids.extend(p_ids);
                    ids.extend(pad);
                }
                None => {
                    if !missing.contains(p) {
                        missing.push(p.clone());
                    }
                }
            }
        }
        ids.extend(&map[EOS]);
        (ids, missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> String {
        format!(
            r#"{{"audio":{{"sample_rate":22050}},"espeak":{{"voice":"en-us"}},
               "phoneme_id_map":{{"_":[0],"^":[1],"$":[2]," ":[3],"a":[14],"b":[15]}}{extra}}}"#
        )
    }

    #[test]
    fn single_speaker_voice_answers_to_its_name_only() {
        let c = VoiceConfig::parse(&config(r#","dataset":"joe""#), "en_US-joe-medium").unwrap();
        assert_eq!(c.voice_names(), ["joe"]);
        assert_eq!(c.speaker_id(None), Ok(None));
        assert_eq!(c.speaker_id(Some("joe")), Ok(None));
        let e = c.speaker_id(Some("alloy")).unwrap_err();
        assert!(e.contains("\"alloy\"") && e.contains("joe"), "{e}");
        assert_eq!((c.noise_scale, c.length_scale, c.noise_w), (0.667, 1.0, 0.8), "Piper's defaults");
    }

    #[test]
    fn multi_speaker_voice_lists_its_speakers_default_first() {
        let c = VoiceConfig::parse(
            &config(r#","num_speakers":3,"speaker_id_map":{"ann":0,"bob":1,"cy":2},"default_speaker_id":1"#),
            "x",
        )
        .unwrap();
        assert_eq!(c.voice_names(), ["bob", "ann", "cy"]);
        assert_eq!(c.speaker_id(None), Ok(Some(1)));
        assert_eq!(c.speaker_id(Some("cy")), Ok(Some(2)));
        let e = c.speaker_id(Some("dee")).unwrap_err();
        assert!(e.contains("\"dee\"") && e.contains("bob, ann, cy"), "{e}");
        let unnamed = VoiceConfig::parse(&config(r#","num_speakers":2"#), "x").unwrap();
        assert_eq!(unnamed.voice_names(), ["0", "1"]);
        assert_eq!(unnamed.speaker_id(Some("1")), Ok(Some(1)));
    }

    #[test]
    fn ids_follow_pipers_layout_and_skip_unknown_phonemes() {
        let c = VoiceConfig::parse(&config(""), "x").unwrap();
        let p = |s: &str| s.chars().map(String::from).collect::<Vec<_>>();
        assert_eq!(c.phoneme_ids(&p("ab a")), (vec![1, 0, 14, 0, 15, 0, 3, 0, 14, 0, 2], vec![]));
        assert_eq!(c.phoneme_ids(&p("aza")), (vec![1, 0, 14, 0, 14, 0, 2], vec!["z".to_string()]));
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        let e = VoiceConfig::parse(r#"{"audio":{"sample_rate":22050}}"#, "x").unwrap_err();
        assert!(e.contains("phoneme_id_map"), "{e}");
        let e = VoiceConfig::parse(&config(r#","phoneme_type":"pinyin""#), "x").unwrap_err();
        assert!(e.contains("pinyin"), "{e}");
        let no_pad = r#"{"audio":{"sample_rate":1},"espeak":{"voice":"en"},"phoneme_id_map":{"^":[1],"$":[2]}}"#;
        assert!(VoiceConfig::parse(no_pad, "x").unwrap_err().contains("\"_\""));
        assert!(VoiceConfig::parse("not json", "x").is_err());
    }

    #[test]
    fn config_sits_beside_the_model() {
        assert_eq!(config_path(Path::new("/m/en_US-joe-medium.onnx")), Path::new("/m/en_US-joe-medium.onnx.json"));
    }
}
